"""The analyzer's outputs: a summary dict, text, JSON (schema in docs/usage.md) and CSV."""
import json
import math

import numpy as np
import pandas as pd

from .units import human

SCHEMA = "attune-usage/1"
QUANTILES = [0.1, 0.25, 0.5, 0.75, 0.9, 0.99]
JOB_FIELDS = ["job_id", "user", "category", "state", "oom", "nodes", "tasks", "steps", "rss_max", "rss_ave",
              "usage_node", "peak_node", "mem_per_node", "util", "util_alloc", "util_peak", "util_eq1",
              "imbalance"]


def _q(s: pd.Series):
    s = s.dropna()
    if s.empty:
        return {f"p{int(q * 100)}": None for q in QUANTILES}
    return {f"p{int(q * 100)}": round(float(s.quantile(q)), 6) for q in QUANTILES}


def summarize(jobs: pd.DataFrame, rec, node_mem=None, system=None, what_if=None, samples_dropped=0):
    fin = jobs[jobs["finished"]]
    measured = jobs[jobs["util"].notna()]
    n_fin = len(fin)
    oom = int(fin["oom"].sum())
    util = measured["util"]
    hist, edges = np.histogram(util.clip(0, 1), bins=20, range=(0, 1))
    s = {
        "schema": SCHEMA,
        "records": {"lines": rec.lines, "malformed": int(sum(rec.malformed.values())),
                    "malformed_by_reason": dict(sorted(rec.malformed.items()))},
        "jobs": int(len(measured)),
        "jobs_seen": int(len(jobs)),
        "jobs_finished": n_fin,
        "jobs_without_usage": int(jobs["usage_node"].isna().sum()),
        "jobs_without_denominator": int((jobs["usage_node"].notna() & jobs["util"].isna()).sum()),
        "denominator": (f"node memory {human(node_mem)}" if node_mem else "memory allocated per node"),
        "oom_jobs": oom,
        "oom_per_10k": round(oom / n_fin * 1e4, 3) if n_fin else None,
        "util": {"mean": round(float(util.mean()), 6) if len(util) else None, **_q(util),
                 "share_below_15pct": round(float((util < 0.15).mean()), 6) if len(util) else None,
                 "histogram": {"edges": [round(float(e), 2) for e in edges], "counts": [int(c) for c in hist]}},
        "util_eq1_paper": _q(measured["util_eq1"]),
        "util_over_denominator": int(measured["util_over"].sum()),
        "imbalance": {**_q(measured["imbalance"]),
                      "share_2x_or_more": round(float((measured["imbalance"] >= 2).mean()), 6) if len(measured) else None},
    }
    if "category" in jobs:
        cats = {}
        for c, g in jobs.groupby("category"):
            gf = g[g["finished"]]
            gm = g[g["util"].notna()]
            cats[str(c)] = {"jobs": int(len(gm)), "util_p50": _round(gm["util"].median()),
                            "util_p90": _round(gm["util"].quantile(0.9)) if len(gm) else None,
                            "oom_per_10k": round(int(gf["oom"].sum()) / len(gf) * 1e4, 3) if len(gf) else None}
        s["categories"] = cats
    if system is not None:
        u = system["util"]
        s["system"] = {"periods": int(len(system)), "mean": _round((system["used"].sum() / system["total"].sum())),
                       **_q(u), "share_above_55pct": _round((u > 0.55).mean()),
                       "samples_dropped": samples_dropped}
    if what_if is not None:
        s["what_if"] = {k: v for k, v in what_if.items() if k != "sweep"}
        s["what_if"]["sweep"] = what_if["sweep"]
    return s


def _round(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


def jobs_json(jobs: pd.DataFrame) -> str:
    """The per-job array, written by pandas (a Python loop over a million dicts is the slow
    part of a big run otherwise)."""
    cols = [c for c in JOB_FIELDS if c in jobs]
    out = jobs[cols].copy()
    for c in ("util", "util_alloc", "util_peak", "util_eq1", "imbalance"):
        if c in out:
            out[c] = out[c].round(6)
    return out.to_json(orient="records", double_precision=10)


def to_json(summary, jobs, system=None) -> str:
    doc = {"schema": SCHEMA, "summary": summary, "jobs": None}
    if system is not None:
        doc["system_over_time"] = [{"time": t.isoformat(), "util": round(float(u), 6), "nodes": int(n)}
                                   for t, u, n in zip(system["time"], system["util"], system["nodes"])]
    head = json.dumps(doc, indent=1, default=_plain)
    return head.replace('"jobs": null', '"jobs": ' + jobs_json(jobs), 1)


def _plain(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.bool_,)):
        return bool(o)
    raise TypeError(type(o))


def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def text(s) -> str:
    r = s["records"]
    u = s["util"]
    im = s["imbalance"]
    lines = [
        f"records: {r['lines']} lines, {r['malformed']} malformed"
        + (" (" + ", ".join(f"{k}: {v}" for k, v in r["malformed_by_reason"].items()) + ")" if r["malformed"] else ""),
        f"jobs: {s['jobs']} with memory figures of {s['jobs_seen']} seen ({s['jobs_finished']} finished, "
        f"{s['jobs_without_usage']} without RSS figures)",
        f"out of memory: {s['oom_jobs']} jobs, {s['oom_per_10k']} per 10,000 finished jobs",
        f"utilization per node (vs {s['denominator']}): median {_pct(u['p50'])}, p90 {_pct(u['p90'])}, "
        f"p99 {_pct(u['p99'])}, mean {_pct(u['mean'])}; {_pct(u['share_below_15pct'])} of jobs below 15%",
        f"  the paper's Eq. 1 (largest task x tasks) would say: median {_pct(s['util_eq1_paper']['p50'])}, "
        f"p90 {_pct(s['util_eq1_paper']['p90'])}",
        f"imbalance (max/mean task RSS): median {im['p50']}, p90 {im['p90']}; "
        f"{_pct(im['share_2x_or_more'])} of jobs at 2x or more",
    ]
    if s.get("jobs_without_denominator"):
        lines.append(f"note: {s['jobs_without_denominator']} jobs have no allocated memory (ReqMem/AllocTRES); "
                     "give --node-mem to measure them against the node")
    for c, v in (s.get("categories") or {}).items():
        lines.append(f"  category {c}: {v['jobs']} jobs, median {_pct(v['util_p50'])}, p90 {_pct(v['util_p90'])}, "
                     f"OOM {v['oom_per_10k']} per 10k")
    if "system" in s:
        y = s["system"]
        lines.append(f"system (Eq. 3, hourly, {y['periods']} hours): mean {_pct(y['mean'])}, median {_pct(y['p50'])}, "
                     f"p90 {_pct(y['p90'])}; above 55% in {_pct(y['share_above_55pct'])} of hours")
    if "what_if" in s:
        w = s["what_if"]
        a = w["at_local_share"]
        lines.append(f"what-if pool ({w['nodes']} nodes): installed {human(w['installed_bytes'])}, sum of node peaks "
                     f"{human(w['sum_of_peaks_bytes'])}, peak of the sum {human(w['peak_of_sums_bytes'])}")
        lines.append(f"  keeping {_pct(a['local_share'])} of each node local: pool {human(a['pool_bytes'])}, "
                     f"DRAM {human(a['total_bytes'])} in all, {human(a['saved_bytes'])} "
                     f"({_pct(a['saved_bytes'] / w['installed_bytes'])}) less than installed")
    return "\n".join(lines) + "\n"
