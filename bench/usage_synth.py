#!/usr/bin/env python3
"""Synthetic sacct dumps with known answers, and the analyzer's throughput benchmark.

generate(jobs, seed) draws jobs of 1-8 nodes, 1-32 tasks per node, a batch step and one to
three srun steps, mixed ReqMem styles (per node 'n', per CPU 'c', Slurm 21.08+ totals),
arrays, OOM endings, and a known utilization per job (the mean per node of its largest
step over its allocation), returned beside the text.

  python3 bench/usage_synth.py --records 1000000      # time `attune usage` on 1M lines
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

HEADER = ("JobID|JobName|User|Account|Partition|State|ExitCode|NNodes|NTasks|AllocCPUS|ReqMem|"
          "AllocTRES|MaxRSS|AveRSS|Elapsed|Start|End")
GIB_K = 1 << 20        # a GiB in KiB


def generate(jobs: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    nodes = rng.integers(1, 9, jobs)
    tpn = rng.integers(1, 33, jobs)
    tasks = nodes * tpn
    cpus = tasks
    mem_node_g = rng.choice([16, 32, 64, 128, 256], jobs)
    util = rng.beta(0.8, 4.0, jobs).round(4)                       # skewed low, as in the paper
    imb = 1 + rng.choice([0, 0, 0, 0.5, 1, 3], jobs)
    steps = rng.integers(1, 4, jobs)
    oom = rng.random(jobs) < 0.001
    style = rng.integers(0, 3, jobs)
    lines = [HEADER]
    expected = {}
    for i in range(jobs):
        jid = f"{100000 + i}" if i % 10 else f"{90000 + i // 10}_{i % 7}"
        n, t, c, mg = int(nodes[i]), int(tasks[i]), int(cpus[i]), int(mem_node_g[i])
        if style[i] == 0:
            req = f"{mg}Gn"
        elif style[i] == 1:
            req = f"{mg * 1024 // (c // n)}Mc"
            mg = (mg * 1024 // (c // n)) * (c // n) / 1024
        else:
            req = f"{mg * n}G"
        alloc_k = int(mg * GIB_K) * n
        mean_node_k = util[i] * mg * GIB_K                          # the largest step's mean per node
        ave_k = int(mean_node_k * n / t)
        max_k = int(ave_k * imb[i])
        state = "OUT_OF_MEMORY" if oom[i] else "COMPLETED"
        tres = f"billing={c},cpu={c},mem={alloc_k}K,node={n}"
        lines.append(f"{jid}|job{i % 50}|u{i % 97}|acct{i % 5}|batch|{state}|0:0|{n}||{c}|{req}|{tres}|||"
                     f"01:00:00|2026-09-01T00:00:00|2026-09-01T01:00:00")
        lines.append(f"{jid}.batch|batch||acct{i % 5}||{state}|0:0|1|1|{c // n}||cpu={c // n},node=1|"
                     f"{min(ave_k, 204800)}K|{min(ave_k, 204800)}K|01:00:00|2026-09-01T00:00:00|2026-09-01T01:00:00")
        for s in range(int(steps[i])):
            scale = 1.0 if s == 0 else 0.5                           # step 0 is the largest
            lines.append(f"{jid}.{s}|step||acct{i % 5}||{state}|0:0|{n}|{t}|{c}||{tres}|{int(max_k * scale)}K|"
                         f"{int(ave_k * scale)}K|00:20:00|2026-09-01T00:00:00|2026-09-01T00:20:00")
        expected[jid] = {"util": min(1.0, ave_k * t / n / (alloc_k / n)), "imbalance": max_k / ave_k if ave_k else 1.0,
                         "oom": bool(oom[i])}
    return "\n".join(lines) + "\n", expected


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000, help="lines to generate (about 4 per job)")
    p.add_argument("--out", default="/tmp/attune-usage-bench.sacct")
    p.add_argument("--attune", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "attune"))
    a = p.parse_args()
    text, _ = generate(max(1, a.records // 4))
    with open(a.out, "w") as f:
        f.write(text)
    n = text.count("\n") - 1
    t0 = time.perf_counter()
    r = subprocess.run([a.attune, "usage", a.out, "--json"], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return 1
    print(f"{n} records in {dt:.1f} s: {n / dt * 60 / 1e6:.2f} million records a minute (JSON of every job included)")
    os.unlink(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
