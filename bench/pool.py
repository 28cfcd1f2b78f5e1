"""The node's far pool (issue 25): far memory held by attuned against the in-process
`memory` tier and the kernel's swap on memory, side by side in one run.

Runs `attune bench --core-only` scenarios (sequential pass and random updates over twice
a 256 MiB budget, thread and signal delivery; the kernel's swap on a memory-backed
device in a cgroup of the same budget as the baseline) once per far tier and
repetition, the tiers interleaved run by run so that all see the same machine load;
prints medians and ratios. Then the memory each costs its job: peak of a cgroup holding
the job (`client workflow CAP 160` on 24 MiB of DRAM), which the pool keeps near the
budget and the in-process tier does not.

Usage: python3 bench/pool.py [--reps 3]   (root: cgroups and swap; make build first)
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
SCENARIOS = [
    ("seq-attune-thread", "seq_read_gbps"),
    ("seq-attune-signal", "seq_read_gbps"),
    ("rand-attune-thread", "updates_per_s"),
    ("rand-attune-signal", "updates_per_s"),
]
KSWAP = ("rand-kswap-memory", "updates_per_s")


def tier_config(d, kind):
    p = d / f"{kind}.toml"
    first = f'[[tier]]\nname = "far"\nkind = "{kind}"\ncapacity = "1G"\n'
    # The file tier behind it only takes what the first cannot (O_DIRECT: no page cache
    # charged to the job).
    p.write_text(first + f'\n[[tier]]\nname = "file"\nkind = "file"\npath = "{d}"\ncapacity = "4G"\ndirect = true\n')
    return p


def bench(env, only):
    out = tempfile.mkdtemp(prefix="attune-pool-bench-")
    cmd = [str(BUILD / "bin" / "attune"), "bench", "--core-only", "--reps", "1", "--only", only, "--out", out]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
    got = {}
    for s in json.load(open(os.path.join(out, "bench.json")))["results"]:
        for k, v in s.get("metrics", {}).items():
            got[(s["scenario"], k)] = v["median"]
    return got


def cgroup_peak(d, env, client):
    g = Path(f"/sys/fs/cgroup/memory/attune-poolbench-{os.getpid()}")
    g.mkdir()
    try:
        (g / "memory.limit_in_bytes").write_text(str(1 << 30))
        r = subprocess.run(["sh", "-c", f'echo $$ > {g}/cgroup.procs && exec "$@"', "sh", str(client),
                            "workflow", "CAP", "160", "3"], env=env, capture_output=True, text=True)
        if r.returncode != 0 or "workflow: OK" not in r.stdout:
            sys.exit(f"workflow failed: {r.stdout}{r.stderr}")
        return int((g / "memory.max_usage_in_bytes").read_text())
    finally:
        for _ in range(50):
            try:
                g.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="attune-pool-"))
    sock = d / "attuned.sock"
    daemon = subprocess.Popen([str(BUILD / "bin" / "attuned"), "--socket", str(sock), "--metrics", "off",
                               "--dram", "2G", "--far-pool", "2G", "--move-limit", "off"],
                              stdout=open(d / "attuned.log", "w"), stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        envs = {
            "memory": dict(os.environ, ATTUNE_CONFIG=str(tier_config(d, "memory")), ATTUNE_DAEMON="off"),
            "pool": dict(os.environ, ATTUNE_CONFIG=str(tier_config(d, "pool")), ATTUNE_SOCKET=str(sock),
                         ATTUNE_DAEMON="require"),
        }
        runs = {k: [] for k in envs}
        kswap = []
        for _ in range(a.reps):
            for k, env in envs.items():
                got = bench(env, "seq-attune")
                got.update(bench(env, "rand-attune"))
                runs[k].append(got)
            kswap.append(bench(dict(os.environ), "rand-kswap-memory").get(KSWAP))
        print("| scenario | metric | in-process `memory` tier | node pool (`pool`, attuned) | pool / memory |")
        print("|---|---|---|---|---|")
        for scen, metric in SCENARIOS:
            med = {k: statistics.median(r[(scen, metric)] for r in runs[k]) for k in envs}
            print(f"| {scen} | {metric} | {med['memory']:.3g} | {med['pool']:.3g} | {med['pool'] / med['memory']:.2f}x |")
        ks = statistics.median(v for v in kswap if v)
        print(f"| rand-kswap-memory | updates_per_s | {ks:.3g} (kernel swap on memory, same budget) | | |")
        for scen in ("rand-attune-thread", "rand-attune-signal"):
            pool = statistics.median(r[(scen, "updates_per_s")] for r in runs["pool"])
            print(f"\n{scen} through the pool / kernel swap on memory: {pool / ks:.2f}x (goal >= 1)")
        client = d / "client"
        subprocess.run(["gcc", "-O2", f"-I{BUILD}/include", f"-I{ROOT}/tests/c", str(ROOT / "tests/daemon/client.c"),
                        "-o", str(client), f"-L{BUILD}/lib", "-lattune", f"-Wl,-rpath,{BUILD}/lib", "-lpthread"],
                       check=True)
        print("\nPeak memory of a job's cgroup, 160 MiB on 24 MiB of DRAM (client workflow CAP 160 3):")
        for k, env in envs.items():
            peaks = [cgroup_peak(d, dict(env, ATTUNE_DRAM="24M"), client) for _ in range(a.reps)]
            print(f"  {k}: {statistics.median(peaks) / 2**20:.1f} MiB")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait()
        subprocess.run(["rm", "-rf", str(d)])


if __name__ == "__main__":
    main()
