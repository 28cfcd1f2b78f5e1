"""Checks an `attune run` JSON report against the schema in docs/run-report.md and
optional expectations. Usage:
  check_report.py REPORT [--exit N] [--signal N] [--min-procs N] [--budget-slack BYTES]
                  [--evictor-share-max F] [--evictor-share-min F] [--chunk N] [--has-command C]
                  [--amplification MIN MAX] [--io-retried] [--regions-by thread|signal]
"""
import argparse
import json
import sys

TOP = {"schema": str, "command": list, "program": str, "managed": bool, "wall_seconds": float,
       "complete": bool, "processes": int, "totals": dict, "tiers": list,
       "hottest_regions": list, "per_process": list}
TOTALS = ["peak_resident_bytes_max", "budget_bytes", "faults", "evictions", "fetched_bytes",
          "evicted_bytes", "moved_bytes", "os_minor_faults", "os_major_faults",
          "fault_ns", "budget_overruns", "room_waits", "room_wait_ns", "direct_reclaims", "evictor_evicted_bytes", "dropped_behind_bytes", "readahead_bytes", "readahead_used_bytes",
          "demand_bytes", "readahead_touched_bytes", "huge_collapses", "huge_splits", "huge_bytes", "clean_bytes", "filled_bytes", "fill_placed_bytes", "zeroed_placed_bytes", "zeroed_placed_ns", "load_errors",
          "online_split_regions", "online_kept_regions", "online_pinned_bytes",
          "managed_requests",
          "fallback_requests", "fixed_adopted", "fixed_released"]
PROC = {"pid": int, "command": list, "final": bool, "budget_bytes": int,
        "peak_resident_bytes": int, "faults": int, "tiers": list, "top_regions": list}
TIER = ["name", "kind", "peak_used_bytes", "bytes_in", "bytes_out", "faults", "evictions", "errors"]


def fail(msg):
    print("check_report: " + msg)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--exit", type=int)
    ap.add_argument("--signal", type=int)
    ap.add_argument("--min-procs", type=int, default=0)
    ap.add_argument("--budget-slack", type=int, default=None)
    ap.add_argument("--has-command", help="a managed process whose program name ends so")
    ap.add_argument("--chunk", type=int, help="every listed region has this chunk size")
    ap.add_argument("--fault-mode", choices=["thread", "signal"],
                    help="every process resolved its faults this way")
    ap.add_argument("--user-mode-only", action="store_true",
                    help="every process ran with a user-mode-only userfaultfd, and --io-retried holds")
    ap.add_argument("--io-retried", action="store_true",
                    help="some system call met a non-resident page, was held and retried, and no EFAULT was passed on")
    ap.add_argument("--filled", action="store_true",
                    help="some evicted chunks were kept as fill words and some placed back by filling")
    ap.add_argument("--regions-by", choices=["thread", "signal"],
                    help="every managed region took this fault delivery")
    ap.add_argument("--min-evictions", type=int,
                    help="at least this many chunks were evicted (the memory was tiered)")
    ap.add_argument("--evictor-share-max", type=float,
                    help="at most this part of the evicted bytes was evicted by the background evictor")
    ap.add_argument("--evictor-share-min", type=float,
                    help="at least this part of the evicted bytes was evicted by the background evictor")
    ap.add_argument("--amplification", type=float, nargs=2, metavar=("MIN", "MAX"),
                    help="the total amplification (moved in by faults over shown touched) lies in [MIN, MAX]")
    a = ap.parse_args()
    r = json.load(open(a.report))
    for k, t in TOP.items():
        if k not in r:
            fail(f"missing {k}")
        if t is float and isinstance(r[k], int):
            continue
        if not isinstance(r[k], t):
            fail(f"{k} is {type(r[k]).__name__}, expected {t.__name__}")
    if r["schema"] != "attune-run-report/1":
        fail("schema " + r["schema"])
    for k in TOTALS:
        if not isinstance(r["totals"].get(k), int):
            fail(f"totals.{k} missing or not an integer")
    for t in r["tiers"]:
        for k in TIER:
            if k not in t:
                fail(f"tier field {k} missing")
    for p in r["per_process"]:
        for k, t in PROC.items():
            if not isinstance(p.get(k), t):
                fail(f"per_process.{k} missing or not {t.__name__}")
        # null without a numa tier; else the tiers and the movement counters.
        if "numa" not in p:
            fail("per_process.numa missing (null without a numa tier)")
        n = p["numa"]
        if n is not None and not (isinstance(n, dict) and isinstance(n.get("tiers"), list)
                                  and isinstance(n.get("counters"), dict)):
            fail("per_process.numa is not {tiers, counters, ...}")
    if r.get("prediction") is not None:
        pr = r["prediction"]
        if not (isinstance(pr, dict) and isinstance(pr.get("runs"), int) and isinstance(pr.get("regions"), list)
                and isinstance(pr.get("encoded"), str)):
            fail("prediction is not {runs, regions, encoded}")
    elif "prediction" not in r:
        fail("missing prediction (null when the history was not used)")
    # Every row's program runs to its end with its data intact: no placement may fail.
    if r["totals"]["load_errors"] != 0:
        fail(f"{r['totals']['load_errors']} placements could not be read back or placed")
    if r["processes"] != len(r["per_process"]):
        fail("processes != len(per_process)")
    if a.exit is not None and r.get("exit_code") != a.exit:
        fail(f"exit_code {r.get('exit_code')} != {a.exit}")
    if a.signal is not None and r.get("signal") != a.signal:
        fail(f"signal {r.get('signal')} != {a.signal}")
    if r["processes"] < a.min_procs:
        fail(f"{r['processes']} managed processes, expected at least {a.min_procs}")
    if a.has_command and not any(p["command"] and p["command"][0].endswith(a.has_command)
                                 for p in r["per_process"]):
        fail(f"no managed process ran {a.has_command}")
    if a.fault_mode and any(p.get("fault_mode") != a.fault_mode for p in r["per_process"]):
        fail(f"a process's fault_mode is not {a.fault_mode}")
    if a.user_mode_only:
        if not all(p.get("uffd_user_mode_only") is True for p in r["per_process"]):
            fail("a process did not report a user-mode-only userfaultfd")
    if a.io_retried or a.user_mode_only:
        procs = r["per_process"]
        if sum(p.get("io_retried_calls", 0) for p in procs) == 0:
            fail("no system call was held and retried")
        if sum(p.get("io_unretried_calls", 0) for p in procs) != 0:
            fail("a system call's EFAULT was passed on")
    if a.filled and not (r["totals"]["filled_bytes"] > 0 and r["totals"]["fill_placed_bytes"] > 0):
        fail(f"filled {r['totals']['filled_bytes']} bytes, placed {r['totals']['fill_placed_bytes']} by filling: "
             "expected both")
    if a.min_evictions is not None and r["totals"].get("evictions", 0) < a.min_evictions:
        fail(f"{r['totals'].get('evictions', 0)} evictions, expected at least {a.min_evictions}")
    if a.regions_by:
        other = "thread" if a.regions_by == "signal" else "signal"
        t = r["totals"]
        if t.get(f"regions_{a.regions_by}", 0) == 0 or t.get(f"regions_{other}", 0) != 0:
            fail(f"regions by signal {t.get('regions_signal')}, by the handler thread {t.get('regions_thread')}: "
                 f"expected every one by {a.regions_by}")
    if a.chunk is not None:
        sizes = {x["chunk_size"] for x in r["hottest_regions"]}
        if sizes != {a.chunk}:
            fail(f"chunk sizes {sorted(sizes)}, expected {a.chunk}")
    if a.budget_slack is not None:
        for p in r["per_process"]:
            if p["peak_resident_bytes"] > p["budget_bytes"] + a.budget_slack:
                fail(f"pid {p['pid']}: peak {p['peak_resident_bytes']} > budget {p['budget_bytes']} + {a.budget_slack}")
        # The run went over its budget somewhere. Not every process must: a forked pool
        # worker that the scheduler gave no task holds only what it inherited (seen in CI:
        # mp_fork's third worker, 0 faults, 0 evictions).
        if a.min_procs and not any(p["evictions"] for p in r["per_process"]):
            fail("no evictions: the footprint never exceeded the budget")
    t = r["totals"]
    if not isinstance(t.get("amplification"), (int, float)):
        fail("totals.amplification missing or not a number")
    if a.amplification and not a.amplification[0] <= t["amplification"] <= a.amplification[1]:
        fail(f"amplification {t['amplification']:.3f} not in [{a.amplification[0]}, {a.amplification[1]}]")
    share = t["evictor_evicted_bytes"] / t["evicted_bytes"] if t["evicted_bytes"] else 0.0
    if (a.evictor_share_max is not None or a.evictor_share_min is not None) and not t["evicted_bytes"]:
        fail("nothing was evicted: the evictor's share cannot be judged")
    if a.evictor_share_max is not None and share > a.evictor_share_max:
        fail(f"the background evictor evicted {share:.1%} of the bytes (at most {a.evictor_share_max:.0%} expected)")
    if a.evictor_share_min is not None and share < a.evictor_share_min:
        fail(f"the background evictor evicted {share:.1%} of the bytes (at least {a.evictor_share_min:.0%} expected)")
    print(f"check_report: OK ({r['processes']} processes, peak {r['totals']['peak_resident_bytes_max']} bytes, "
          f"evictor share {share:.1%}, amplification {t['amplification']:.2f})")


main()
