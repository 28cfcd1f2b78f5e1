"""Kernel feature fallbacks (issue 29): each fallback against the feature it replaces, on
this machine's kernel with `ATTUNE_KERNEL_FEATURES` masking the feature. Runs
`attune bench --core-only` scenarios (fault latency, sequential pass, random updates,
the kernel's swap on memory as the baseline) once per mask and repetition, the masks
interleaved run by run so that all see the same machine load; prints medians and the
ratio of each mask to no mask.

Usage: python3 bench/kernel_features.py [--reps 3] [--masks ",-move,-poison,-all"]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# (scenario, metric, higher is better)
METRICS = [
    ("fault-attune-thread", "fault_median_us", False),
    ("fault-attune-signal", "fault_median_us", False),
    ("seq-attune-thread", "seq_read_gbps", True),
    ("seq-attune-signal", "seq_read_gbps", True),
    ("seq-attune-thread", "fill_evict_gbps", True),
    ("seq-attune-signal", "fill_evict_gbps", True),
    ("rand-attune-thread", "updates_per_s", True),
    ("rand-attune-signal", "updates_per_s", True),
    ("rand-kswap-memory", "updates_per_s", True),
]


def once(attune, mask, only):
    out = tempfile.mkdtemp(prefix="attune-kf-")
    env = {**os.environ, "ATTUNE_KERNEL_FEATURES": mask}
    cmd = [attune, "bench", "--core-only", "--reps", "1", "--only", only, "--out", out]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"ATTUNE_KERNEL_FEATURES={mask} {' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
    got = {}
    with open(os.path.join(out, "bench.json")) as f:
        results = json.load(f)["results"]
    shutil.rmtree(out, ignore_errors=True)
    for s in results:
        for k, v in s.get("metrics", {}).items():
            got[(s["scenario"], k)] = v["median"]
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--masks", default=",-move,-poison,-all")
    ap.add_argument("--attune", default=os.path.join(HERE, "..", "build", "bin", "attune"))
    a = ap.parse_args()
    masks = a.masks.split(",")
    runs = {m: [] for m in masks}
    for _ in range(a.reps):
        for m in masks:
            got = {}
            for only in ("fault", "seq", "rand"):
                got.update(once(a.attune, m, only))
            runs[m].append(got)
    print("| scenario | metric | " + " | ".join(f"`{m or 'none'}`" for m in masks) + " |")
    print("|---|---|" + "---|" * len(masks))
    for scen, metric, _ in METRICS:
        cells = []
        base = None
        for m in masks:
            vals = [r[(scen, metric)] for r in runs[m] if (scen, metric) in r]
            if not vals:
                cells.append("-")
                continue
            med = statistics.median(vals)
            if base is None:
                base = med
                cells.append(f"{med:.3g}")
            else:
                cells.append(f"{med:.3g} ({med / base:.2f}x)")
        print(f"| {scen} | {metric} | " + " | ".join(cells) + " |")
    # The goal: every 6.x feature masked, random updates at least the kernel's
    # swap on memory (zram), both measured in the same run.
    if "-all" in masks:
        for scen in ("rand-attune-thread", "rand-attune-signal"):
            att = [r[(scen, "updates_per_s")] for r in runs["-all"] if (scen, "updates_per_s") in r]
            ks = [r[("rand-kswap-memory", "updates_per_s")] for r in runs["-all"]
                  if ("rand-kswap-memory", "updates_per_s") in r]
            if att and ks:
                print(f"\n{scen} with -all / kernel swap on memory: "
                      f"{statistics.median(att) / statistics.median(ks):.2f}x (goal >= 1)")


if __name__ == "__main__":
    main()
