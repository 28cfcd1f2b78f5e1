"""An unmodified numpy program at half its footprint in DRAM: `attune run` against the
kernel's swap at the same budget (a cgroup memory limit, swap on a memory medium
(a zram device of ours) and on disk), next to the program with all the memory it wants (IE). All four are
interleaved run by run in one invocation. Needs root (swap and cgroups).

Usage: python3 bench/run_vs_kswap.py [--reps 3] [--mib 256]
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

# Far tiers of the recorded figures: emulated in the process (the `memory` tier, then a
# file), as they were taken. Without a far device the default (`far = "auto"`) is a file
# on local scratch; ATTUNE_BENCH_FAR=auto measures that instead.
EMULATED = os.environ.get("ATTUNE_BENCH_FAR", "memory,file")

HERE = os.path.dirname(os.path.abspath(__file__))
ATT = os.path.join(HERE, "..", "build", "bin", "attune")
PROG = [sys.executable, os.path.join(HERE, "..", "tests", "run", "numpy_work.py")]


def timed(cmd):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or "numpy_work: OK" not in r.stdout:
        sys.exit(f"{cmd[:4]} failed ({r.returncode}): {r.stdout[-300:]} {r.stderr[-600:]}")
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mib", type=int, default=256)
    a = ap.parse_args()
    prog = PROG + [str(a.mib)]
    # RUSAGE_CHILDREN's maxrss is the largest child so far: measure the smaller first.
    # Attune's budget covers managed memory only; the interpreter and numpy themselves
    # (measured alone) stay outside it, so they are subtracted for the same total.
    subprocess.run([sys.executable, "-c", "import numpy"], check=True)
    base = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    timed(prog)
    foot = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if foot <= base:
        sys.exit("could not measure the footprint")
    budget = foot // 2
    b = f"{budget >> 20}M"
    b_att = f"{max(budget - base, 16 << 20) >> 20}M"
    envs = {
        "IE (no limit)": prog,
        "attune run": [ATT, "run", "-q", "--far", EMULATED, "--dram", b_att, "--"] + prog,
        "attune run --chunk 4K": [ATT, "run", "-q", "--far", EMULATED, "--chunk", "4K", "--dram", b_att, "--"] + prog,
        "kernel swap, memory": [ATT, "kernel-swap", "--limit", b, "--swap", "memory", "--"] + prog,
        "kernel swap, disk": [ATT, "kernel-swap", "--limit", b, "--swap", "disk", "--"] + prog,
    }
    times = {k: [] for k in envs}
    for _ in range(a.reps):
        for k, cmd in envs.items():
            times[k].append(timed(cmd))
    ie = statistics.median(times["IE (no limit)"])
    att = statistics.median(times["attune run"])
    print(f"footprint (IE peak RSS) {foot >> 20} MiB, budget {b} (attune: {b_att} managed + the interpreter), {a.reps} runs each\n")
    print("| environment | median (s) | spread (s) | vs IE | attune run speed-up |")
    print("|---|---|---|---|---|")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"| {k} | {m:.2f} | {min(v):.2f}-{max(v):.2f} | {m / ie:.2f}x | {m / att:.2f}x |")


main()
