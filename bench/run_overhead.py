"""`attune run` overhead on an allocation-heavy program that fits in DRAM (issue: goal
within 5% of running it without Attune). Plain and `attune run` are interleaved, run by
run, in one invocation, so both see the same machine load; medians and spreads printed.

Usage: python3 bench/run_overhead.py [--reps 7] [--attune build/bin/attune]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(cmd):
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--attune", default=os.path.join(HERE, "..", "build", "bin", "attune"))
    a = ap.parse_args()
    exe = os.path.join(tempfile.mkdtemp(prefix="attune-bench-"), "alloc_heavy")
    subprocess.run(["gcc", "-O2", os.path.join(HERE, "alloc_heavy.c"), "-o", exe], check=True)
    print("| workload | plain median (s) | attune run median (s) | ratio | plain spread | attune spread |")
    print("|---|---|---|---|---|---|")
    for mode in ["small", "large"]:
        plain, att = [], []
        for _ in range(a.reps):
            tp, op = timed([exe, mode])
            ta, oa = timed([a.attune, "run", "-q", "--dram", "2G", "--", exe, mode])
            if op != oa:
                sys.exit(f"checksums differ: {op!r} vs {oa!r}")
            plain.append(tp)
            att.append(ta)
        mp, ma = statistics.median(plain), statistics.median(att)
        print(f"| {mode} | {mp:.3f} | {ma:.3f} | {ma / mp:.3f} | {min(plain):.3f}-{max(plain):.3f} | {min(att):.3f}-{max(att):.3f} |")


main()
