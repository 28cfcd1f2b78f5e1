"""Placement benchmark (issue 4): a mixed program at half its footprint in DRAM.

bench/mixed.c has a LAT lookup table (5% of the footprint, random reads, latency timed),
BW arrays streamed every iteration (50%) and CAP data touched rarely (45%). Runs, one
after another in each round so that they share the machine's state (rounds repeated
--reps times, medians reported):
  no-pressure     Attune attuned, budget = 2x the footprint (the reference latency)
  attuned         Attune attuned, budget = half the footprint
  temperature     Attune temperature-only (ATTUNE_MODE=temperature), same budget
  kernel-swap     plain memory in a cgroup limit of the same budget, swap on a
                  memory medium (a zram device of ours; root only, skipped otherwise)
each at the configured chunk size (4K default) and at 64K (--chunks).

Usage: python3 bench/mixed.py [--mib 512] [--iters 10] [--lookups 1000000] [--reps 3]
Needs `make build` (links bench/mixed.c against build/).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

# Far tiers of the recorded figures: emulated in the process (the `memory` tier, then a
# file), as they were taken. Without a far device the default (`far = "auto"`) is a file
# on local scratch; ATTUNE_BENCH_FAR=auto measures that instead.
EMULATED = os.environ.get("ATTUNE_BENCH_FAR", "memory,file")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.path.join(ROOT, "build")
ATT = os.path.join(BUILD, "bin", "attune")


def build(out):
    pc = os.path.join(BUILD, "lib", "pkgconfig")
    env = dict(os.environ, PKG_CONFIG_PATH=pc)
    flags = subprocess.check_output(["pkg-config", "--cflags", "--libs", "attune"], env=env, text=True).split()
    subprocess.run(["gcc", "-O2", os.path.join(HERE, "mixed.c"), "-o", out, *flags,
                    f"-Wl,-rpath,{BUILD}/lib"], check=True)


def run(cmd, env, may_fail=False):
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **env))
    if may_fail and r.returncode != 0 and "killed by signal 9" in r.stdout + r.stderr:
        return None  # the kernel's OOM killer under the cgroup limit: counted, not fatal
    m = re.search(r"mixed: OK seconds=([\d.]+) lookup_p50_ns=(\d+) lookup_p99_ns=(\d+) lat_faults_in_loop=(\d+) lookup_p999_ns=(\d+) lookup_seconds=([\d.]+)", r.stdout)
    if r.returncode != 0 or not m:
        sys.exit(f"{' '.join(cmd[:3])} {env} failed ({r.returncode}):\n{r.stdout[-500:]}\n{r.stderr[-800:]}")
    return {"s": float(m[1]), "p50": int(m[2]), "p99": int(m[3]), "lat_faults": int(m[4]),
            "p999": int(m[5]), "lookup_s": float(m[6])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--lookups", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunks", default="4K,64K")
    ap.add_argument("--no-kernel", action="store_true")
    a = ap.parse_args()
    if a.mib < 64 or a.iters < 1 or a.reps < 1:
        sys.exit("--mib must be at least 64, --iters and --reps at least 1")
    tmp = tempfile.TemporaryDirectory(prefix="attune-mixed-")
    prog = os.path.join(tmp.name, "mixed")
    build(prog)
    args = [prog, str(a.mib), str(a.iters), str(a.lookups)]
    budget = f"{a.mib // 2}M"
    cases = []
    for ch in a.chunks.split(","):
        base = {"ATTUNE_CHUNK_SIZE": ch, "ATTUNE_FAR": EMULATED}
        cases += [
            (f"no-pressure {ch}", args, dict(base, ATTUNE_DRAM=f"{a.mib * 2}M")),
            (f"attuned {ch}", args, dict(base, ATTUNE_DRAM=budget)),
            (f"temperature {ch}", args, dict(base, ATTUNE_DRAM=budget, ATTUNE_MODE="temperature")),
        ]
    if not a.no_kernel and os.geteuid() == 0:
        # The program's own memory beyond the footprint (binary, libc, latency samples)
        # is a few MiB; the limit includes it so that the data gets the same budget.
        extra = 8 + a.iters * a.lookups // 8 * 8 // (1 << 20)
        cases.append(("kernel-swap memory", [ATT, "kernel-swap", "--limit", f"{a.mib // 2 + extra}M",
                                             "--swap", "memory", "--swap-size", f"{a.mib * 2}M", "--",
                                             *args], {"ATTUNE_DISABLE_UFFD": "1"}))
    res = {name: [] for name, _, _ in cases}
    for rep in range(a.reps):
        for name, cmd, env in cases:
            res[name].append(run(cmd, env, may_fail=name.startswith("kernel")))
        print(f"round {rep + 1}/{a.reps} done", file=sys.stderr)
    raw = dict(res)
    killed = {n: sum(r is None for r in rs) for n, rs in res.items()}
    res = {n: [r for r in rs if r] for n, rs in res.items()}
    res = {n: rs for n, rs in res.items() if rs}
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in res.items()}
    print(f"mixed program: {a.mib} MiB footprint, DRAM budget {budget}, {a.iters} iterations, "
          f"{a.lookups} lookups each, median of {a.reps}\n")
    print("| run | time (s) | spread (s) | of which lookups (s) | lookup p50 / p99 / p99.9 (ns) | LAT faults in loop |")
    print("|---|---|---|---|---|---|")
    for n, rs in res.items():
        ts = [r["s"] for r in rs]
        m = med[n]
        print(f"| {n} | {m['s']:.3f} | {min(ts):.3f}-{max(ts):.3f} | {m['lookup_s']:.3f} | "
              f"{m['p50']:.0f} / {m['p99']:.0f} / {m['p999']:.0f} | {m['lat_faults']:.0f} |"
              + (f" OOM-killed in {killed[n]} of {a.reps} runs" if killed[n] else ""))
    print()
    for ch in a.chunks.split(","):
        at, te, npr = med[f"attuned {ch}"], med[f"temperature {ch}"], med[f"no-pressure {ch}"]
        # Paired within each round (the two runs seconds apart): the host's speed changes
        # from round to round by more than the difference measured.
        pairs = [1 - x["s"] / y["s"] for x, y in zip(raw[f"attuned {ch}"], raw[f"temperature {ch}"])
                 if x and y]
        paired = (f" (per round: median {100 * statistics.median(pairs):.0f}%, "
                  f"{100 * min(pairs):.0f}-{100 * max(pairs):.0f}%)") if pairs else ""
        print(f"- {ch}: attuned run time {100 * (1 - at['s'] / te['s']):.0f}% lower than temperature-only"
              f"{paired} (goal 25%); attuned LAT p99 under pressure {at['p99'] / npr['p99']:.2f}x its value "
              f"without pressure (goal 1.1x), p99.9 {at['p999'] / npr['p999']:.2f}x; temperature-only "
              f"p99 {te['p99'] / npr['p99']:.2f}x, p99.9 {te['p999'] / npr['p999']:.1f}x; time in lookups "
              f"{te['lookup_s'] / at['lookup_s']:.1f}x the attuned")
    if "kernel-swap memory" in med:
        k = med["kernel-swap memory"]
        print(f"- kernel swap (memory): {k['s']:.3f} s, {k['s'] / med['attuned ' + a.chunks.split(',')[0]]['s']:.2f}x the attuned time; p99 {k['p99']:.0f} ns")


if __name__ == "__main__":
    main()
