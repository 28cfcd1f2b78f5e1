"""Node memory samples: system-wide utilization over time (paper Eq. 3) and the
shared-pool what-if.

Samples are a CSV with columns time, node, MemTotal, MemFree (found by header name, any
case; extra columns ignored). time is ISO 8601 or seconds since the epoch; MemTotal and
MemFree are kB as in /proc/meminfo unless they carry a unit ("64G").
"""
import numpy as np
import pandas as pd

from .units import parse_size


class SamplesError(Exception):
    pass


def read_samples(path):
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False, on_bad_lines="skip", engine="c")
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise SamplesError(f"cannot read node samples {path}: {e}")
    cols = {c.strip().lower(): c for c in raw.columns}
    need = ["time", "node", "memtotal", "memfree"]
    miss = [n for n in need if n not in cols]
    if miss:
        raise SamplesError(f"node samples {path}: no column {', '.join(miss)} "
                           f"(header: {', '.join(raw.columns)}); expected time,node,MemTotal,MemFree")
    t_raw = raw[cols["time"]].str.strip()
    t_num = pd.to_numeric(t_raw, errors="coerce")
    t = pd.to_datetime(t_num, unit="s", errors="coerce")
    iso = t_num.isna()
    if iso.any():
        t[iso] = pd.to_datetime(t_raw[iso], errors="coerce", utc=True, format="mixed").dt.tz_localize(None)
    total, bad_t, _ = parse_size(raw[cols["memtotal"]], "K")
    free, bad_f, _ = parse_size(raw[cols["memfree"]], "K")
    node = raw[cols["node"]].str.strip()
    ok = t.notna() & total.notna() & free.notna() & (total > 0) & (free <= total) & node.ne("")
    df = pd.DataFrame({"time": t, "node": node, "total": total, "used": total - free})[ok]
    return df.reset_index(drop=True), int((~ok).sum())


def utilization_over_time(samples: pd.DataFrame, period="1h") -> pd.DataFrame:
    """Eq. 3 per period: sum of (MemTotal - MemFree) over sum of MemTotal, all nodes."""
    g = samples.groupby(samples["time"].dt.floor(period))
    out = g.agg(used=("used", "sum"), total=("total", "sum"), nodes=("node", "nunique"))
    out["util"] = out["used"] / out["total"]
    return out.reset_index()


def pool_what_if(samples: pd.DataFrame, local_share=0.5, bucket="5min", step=0.05):
    """How much DRAM a shared pool would save.

    Per node, memory in use per time bucket (the bucket's largest sample; a node without a
    sample in a bucket keeps its last value). Today each node is provisioned for its own
    peak at least (sum of peaks); a pool sized to the largest simultaneous demand (peak of
    sums) serves the same use. With local DRAM L per node (a share f of the node's memory)
    and the rest from a pool, the pool needs max over time of sum over nodes of
    max(0, use - L); total DRAM = sum of L + pool. Fewer local DRAM always needs less in
    all (f = 0 gives the peak of sums), so there is no optimum to pick: the caller's share
    (how much each node keeps local for latency) is the headline, the sweep is the curve.
    """
    b = samples.assign(bucket=samples["time"].dt.floor(bucket))
    used = b.pivot_table(index="bucket", columns="node", values="used", aggfunc="max").sort_index().ffill().fillna(0.0)
    cap = b.groupby("node")["total"].max().reindex(used.columns)
    u = used.to_numpy()
    c = cap.to_numpy()
    sum_of_peaks = float(u.max(axis=0).sum())
    peak_of_sums = float(u.sum(axis=1).max())
    installed = float(c.sum())
    sweep = []
    for f in np.arange(0.0, 1.0 + 1e-9, step):
        local = f * c
        pool = float(np.clip(u - local, 0, None).sum(axis=1).max())
        total = float(local.sum()) + pool
        sweep.append({"local_share": round(float(f), 4), "local_bytes": float(local.sum()),
                      "pool_bytes": pool, "total_bytes": total, "saved_bytes": installed - total})
    local = local_share * c
    pool = float(np.clip(u - local, 0, None).sum(axis=1).max())
    at = {"local_share": local_share, "local_bytes": float(local.sum()), "pool_bytes": pool,
          "total_bytes": float(local.sum()) + pool, "saved_bytes": installed - float(local.sum()) - pool}
    return {
        "nodes": int(len(c)), "buckets": int(len(u)), "bucket": bucket,
        "installed_bytes": installed, "sum_of_peaks_bytes": sum_of_peaks,
        "peak_of_sums_bytes": peak_of_sums, "at_local_share": at, "sweep": sweep,
    }
