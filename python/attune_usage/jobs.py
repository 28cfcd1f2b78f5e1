"""Per-job memory utilization (paper Eq. 1) and imbalance (Eq. 2) from step records.

Why not Eq. 1 as printed: it multiplies the largest task's RSS by the task count, as if
every task were the largest; with any imbalance that overstates a node's use, and a
multi-step job's MaxRSS belongs to one step, not to the job. So, per step s with T tasks on
N nodes (a step's MaxRSS is the largest task of that step, AveRSS the mean over its tasks):

    mean per node  = AveRSS * T / N             (what an average node of the step held)
    peak per node  = MaxRSS * ceil(T / N)       (a bound for the busiest node)
    Eq. 1 per node = MaxRSS * T / N             (the paper's estimate, kept for comparison)

and per job the step with the largest mean per node counts (steps run one after another;
the batch step runs on the first node only and is a step like the others). Imbalance is
that step's MaxRSS / AveRSS (Eq. 2; 1 = balanced; 1 when AveRSS is missing).
``util`` divides by the node's memory when it is given (the paper's S_mem) and by the
memory the job was allocated per node otherwise; ``util_alloc`` always by the allocation.
"""
import re
import warnings

import numpy as np
import pandas as pd

from .units import parse_size, tres_mem

NOT_FINISHED = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED"}


def _num(df, name):
    if name not in df:
        return pd.Series(np.nan, index=df.index), pd.Series(False, index=df.index)
    s = df[name].str.strip()
    v = pd.to_numeric(s, errors="coerce")
    bad = v.isna() & s.ne("")
    return v, bad


def _size(df, name, base):
    if name not in df:
        return (pd.Series(np.nan, index=df.index), pd.Series(False, index=df.index),
                pd.Series("", index=df.index))
    return parse_size(df[name], base)


def analyze(rec, node_mem=None, category_column=None, category_rules=None):
    """Data frame of one row per job, and the records' malformed counter updated."""
    df = rec.frame
    state = df["State"].str.strip().str.split(" ").str[0].str.upper()
    maxrss, bad_max, _ = _size(df, "MaxRSS", "K")
    averss, bad_ave, _ = _size(df, "AveRSS", "K")
    tasks, bad_t = _num(df, "NTasks")
    nodes, bad_n = _num(df, "NNodes")
    cpus, bad_c = _num(df, "AllocCPUS" if "AllocCPUS" in df else "NCPUS")
    reqmem, bad_r, per = _size(df, "ReqMem", "M")
    tres_col = "AllocTRES" if "AllocTRES" in df else "ReqTRES"
    if tres_col in df:
        tmem, bad_tr = tres_mem(df[tres_col])
    else:
        tmem, bad_tr = pd.Series(np.nan, index=df.index), pd.Series(False, index=df.index)
    checks = {"MaxRSS not a size": bad_max, "AveRSS not a size": bad_ave, "NTasks not a number": bad_t,
              "NNodes not a number": bad_n, "CPU count not a number": bad_c, "ReqMem not a size": bad_r,
              "TRES mem not a size": bad_tr}
    anybad = pd.Series(False, index=df.index)
    for reason, mask in checks.items():
        mask = mask & ~anybad
        n = int(mask.sum())
        if n:
            rec.malformed[reason] += n
            if len(rec.examples) < 5:
                rec.examples.append((None, f"{reason}: {df.loc[mask, 'JobID'].iloc[0]!r}"))
        anybad |= mask
    keep = ~anybad
    lines = pd.DataFrame({
        "job": df["job"], "step": df["step"], "state": state, "maxrss": maxrss, "averss": averss,
        "tasks": tasks, "nodes": nodes, "cpus": cpus, "reqmem": reqmem, "per": per, "tres_mem": tmem,
    })[keep]
    for extra in ("User", "Account", "Partition", "JobName", "Start", "End", "Elapsed"):
        if extra in df:
            lines[extra.lower()] = df.loc[keep, extra]
    if category_column:
        if category_column not in df:
            raise KeyError(category_column)
        lines["category"] = df.loc[keep, category_column].str.strip().replace("", "unknown")

    joblines = lines[lines["step"] == ""].drop_duplicates("job", keep="last").set_index("job")
    steps = lines[lines["maxrss"].notna()].copy()
    # A step's figures: tasks and nodes default to 1, a missing AveRSS to MaxRSS.
    t = steps["tasks"].fillna(1).clip(lower=1)
    n = steps["nodes"].fillna(1).clip(lower=1)
    ave = steps["averss"].fillna(steps["maxrss"])
    steps["mean_node"] = ave * t / n
    steps["peak_node"] = steps["maxrss"] * np.ceil(t / n)
    steps["eq1_node"] = steps["maxrss"] * t / n
    steps["imb"] = np.where(ave > 0, steps["maxrss"] / ave.where(ave > 0, 1), 1.0)
    steps["ntasks"] = t
    best = steps.sort_values(["job", "mean_node"]).drop_duplicates("job", keep="last").set_index("job")
    agg = steps.groupby("job").agg(peak_node=("peak_node", "max"), eq1_node=("eq1_node", "max"),
                                   rss_max=("maxrss", "max"), nsteps=("step", "size"),
                                   tasks=("ntasks", "max"))
    states = lines["state"].str.startswith("OUT_OF_ME").groupby(lines["job"]).any()

    jobs = pd.DataFrame(index=pd.Index(lines["job"].unique(), name="job"))
    jobs["oom"] = states.reindex(jobs.index).fillna(False).astype(bool)
    jobs["state"] = joblines["state"].reindex(jobs.index)
    step_nodes = lines.groupby("job")["nodes"].max()
    jobs["nodes"] = joblines["nodes"].reindex(jobs.index).fillna(step_nodes).fillna(1).clip(lower=1)
    jobs["tasks"] = agg["tasks"].reindex(jobs.index).astype("Int64")
    jobs["nodes"] = jobs["nodes"].astype(int)
    jobs["steps"] = agg["nsteps"].reindex(jobs.index).fillna(0).astype(int)
    jobs["rss_max"] = agg["rss_max"].reindex(jobs.index)
    jobs["rss_ave"] = best["averss"].reindex(jobs.index).fillna(best["maxrss"].reindex(jobs.index))
    jobs["usage_node"] = best["mean_node"].reindex(jobs.index)
    jobs["peak_node"] = agg["peak_node"].reindex(jobs.index)
    jobs["eq1_node"] = agg["eq1_node"].reindex(jobs.index)
    jobs["imbalance"] = best["imb"].reindex(jobs.index)
    jobs["mem_per_node"] = _alloc_per_node(joblines, jobs["nodes"])
    for extra in ("user", "account", "partition", "jobname", "start", "end", "elapsed", "category"):
        if extra in joblines:
            jobs[extra] = joblines[extra].reindex(jobs.index)
        elif extra in lines:
            jobs[extra] = lines.groupby("job")[extra].first().reindex(jobs.index)
    if category_rules:
        name = jobs["jobname"] if "jobname" in jobs else pd.Series("", index=jobs.index)
        cat = pd.Series("other", index=jobs.index)
        done = pd.Series(False, index=jobs.index)
        for label, rx in category_rules:
            with warnings.catch_warnings():      # groups in a user's pattern are fine here
                warnings.simplefilter("ignore", UserWarning)
                hit = name.fillna("").str.contains(rx, regex=True) & ~done
            cat[hit] = label
            done |= hit
        jobs["category"] = cat
    denom = node_mem if node_mem else jobs["mem_per_node"]
    jobs["util"] = (jobs["usage_node"] / denom).clip(upper=1.0)
    jobs["util_over"] = jobs["usage_node"] > denom          # used more than the denominator
    jobs["util_alloc"] = jobs["usage_node"] / jobs["mem_per_node"]
    jobs["util_peak"] = jobs["peak_node"] / denom
    jobs["util_eq1"] = jobs["eq1_node"] / denom
    # Finished and started: a job cancelled before it ran has no steps and no start time.
    started = jobs["steps"].gt(0)
    if "start" in jobs:
        started |= ~jobs["start"].fillna("").str.strip().isin(["", "Unknown", "None"])
    jobs["finished"] = ~jobs["state"].isin(NOT_FINISHED) & started
    return jobs.reset_index().rename(columns={"job": "job_id"})


def _alloc_per_node(joblines, nodes):
    """Memory allocated per node: AllocTRES mem (the job's total) / nodes; else ReqMem, whose
    'n' suffix is per node, 'c' per CPU (times the job's CPUs over its nodes), and with no
    suffix (Slurm 21.08 and later print the mem of ReqTRES) the job's total."""
    idx = nodes.index
    t = joblines["tres_mem"].reindex(idx)
    r = joblines["reqmem"].reindex(idx)
    per = joblines["per"].reindex(idx).fillna("")
    cpus = joblines["cpus"].reindex(idx)
    from_req = np.where(per == "n", r, np.where(per == "c", r * cpus / nodes, r / nodes))
    return t.div(nodes).fillna(pd.Series(from_req, index=idx))


def parse_rules(specs):
    """["SIM=^(lmp|nek)", "ML=train"] -> [(label, compiled regex)], ValueError on a bad one."""
    out = []
    for s in specs or []:
        if "=" not in s:
            raise ValueError(f"--category-rule {s!r}: expected LABEL=REGEX")
        label, rx = s.split("=", 1)
        try:
            re.compile(rx)
        except re.error as e:
            raise ValueError(f"--category-rule {s!r}: bad regular expression: {e}")
        out.append((label.strip(), rx))
    return out
