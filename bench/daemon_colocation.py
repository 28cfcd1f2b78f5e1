#!/usr/bin/env python3
"""A latency-sensitive workflow next to a capacity-hungry one on a full node, with the
node daemon (attuned) and under kernel swap with the same total memory; side by side,
interleaved, in one run (docs/benchmarks.md).

  python3 bench/daemon_colocation.py [--reps 3] [--pool 128] [--lat-mib 32] [--cap-mib 256] [--sweeps 40] [--no-pin]

Each workflow runs on its own core (taskset: LAT on CPU 0, CAP on CPU 1), as Slurm's
cpusets give co-located jobs; --no-pin lets them share both cores.

Rows, each the LAT workflow's time for a fixed number of verified sweeps over its data:
  attuned alone / attuned pair: the runtimes join attuned, whose pool is --pool MiB; the
      far tier is the runtime's memory tier (emulated far memory, as in bench/imme.py);
  kernel alone / kernel pair: plain memory (ATTUNE_DISABLE_UFFD=1) in one cgroup limited
      to --pool MiB with a memory-backed swap device (`attune kernel-swap --swap memory`).
Also: how long the capacity workflow took to give DRAM back when the LAT one arrived
(attuned's last_reclaim_ms), and the control-plane rates of `attune daemon-bench`.
Needs root (cgroup, swap) and a staged build (make build).
"""
import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
ATTUNE, ATTUNED = BUILD / "bin" / "attune", BUILD / "bin" / "attuned"


def build_client(d):
    exe = d / "client"
    subprocess.run(["gcc", "-O2", f"-I{BUILD}/include", f"-I{ROOT}/tests/c", str(ROOT / "tests/daemon/client.c"),
                    "-o", str(exe), f"-L{BUILD}/lib", "-lattune", f"-Wl,-rpath,{BUILD}/lib", "-lpthread"], check=True)
    return exe


def elapsed(out):
    m = re.search(r"sweeps: OK .*elapsed_s=([0-9.]+)", out)
    if not m:
        raise RuntimeError("LAT workflow failed: " + out[-2000:])
    return float(m.group(1))


class Daemon:
    def __init__(self, d, pool, move_limit="1G"):
        self.sock = str(d / f"b{random.randrange(1 << 30)}.sock")
        self.p = subprocess.Popen([str(ATTUNED), "--socket", self.sock, "--dram", f"{pool}M", "--metrics", "off",
                                   "--min-grant", "8M", "--move-limit", move_limit], stderr=subprocess.DEVNULL)
        for _ in range(200):
            if os.path.exists(self.sock):
                break
            time.sleep(0.02)
        time.sleep(0.1)

    def status(self):
        return json.loads(subprocess.check_output([str(ATTUNE), "status", "--json", "--socket", self.sock]))

    def stop(self):
        self.p.terminate()
        self.p.wait()


def pin(a, cpu):
    return [] if a.no_pin else ["taskset", "-c", str(cpu)]


def attuned_run(exe, d, a, pair):
    dm = Daemon(d, a.pool, a.move_limit)
    env = dict(os.environ, ATTUNE_SOCKET=dm.sock, ATTUNE_DAEMON="require", ATTUNE_DRAM=f"{a.pool}M")
    cap = None
    reclaim = None
    try:
        if pair:
            cap = subprocess.Popen([*pin(a, 1), str(exe), "workflow", "CAP", str(a.cap_mib), "600"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.5)  # the capacity workflow fills its grant first
        out = subprocess.run([*pin(a, 0), str(exe), "sweeps", "LAT", str(a.lat_mib), str(a.sweeps)], env=env,
                             capture_output=True, text=True, timeout=900)
        if pair:
            reclaim = dm.status()["last_reclaim_ms"]
    finally:
        if cap:
            cap.send_signal(signal.SIGKILL)
            cap.wait()
        dm.stop()
    return elapsed(out.stdout + out.stderr), reclaim


def kernel_run(exe, a, pair):
    t0, t1 = " ".join(pin(a, 0)), " ".join(pin(a, 1))
    inner = f"{t0} '{exe}' sweeps LAT {a.lat_mib} {a.sweeps}"
    if pair:
        inner = (f"{t1} '{exe}' workflow CAP {a.cap_mib} 600 >/dev/null 2>&1 & c=$!; sleep 1.5; {inner}; "
                 f"kill -9 $c; wait $c 2>/dev/null; true")
    env = dict(os.environ, ATTUNE_DISABLE_UFFD="1", ATTUNE_DAEMON="off")
    out = subprocess.run([str(ATTUNE), "kernel-swap", "--limit", f"{a.pool}M", "--swap", "memory", "--swap-size", "1G",
                          "--", "sh", "-c", inner], env=env, capture_output=True, text=True, timeout=1800)
    return elapsed(out.stdout + out.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pool", type=int, default=128, help="DRAM of the node, MiB")
    ap.add_argument("--lat-mib", type=int, default=32)
    ap.add_argument("--cap-mib", type=int, default=256)
    ap.add_argument("--sweeps", type=int, default=40)
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--move-limit", default="1G", help="attuned --move-limit (bytes/s or off)")
    ap.add_argument("--no-pin", action="store_true", help="let the workflows share all cores")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (cgroup memory limit and a swap device for the kernel rows)")
    d = Path(tempfile.mkdtemp(prefix="attune-coloc-"))
    exe = build_client(d)
    rows = {k: [] for k in ("attuned alone", "attuned pair", "kernel alone", "kernel pair")}
    reclaims = []
    for r in range(a.reps):
        order = list(rows)
        random.Random(r).shuffle(order)
        for k in order:
            if k.startswith("attuned"):
                t, rc = attuned_run(exe, d, a, k.endswith("pair"))
                if rc is not None:
                    reclaims.append(rc)
            else:
                t = kernel_run(exe, a, k.endswith("pair"))
            rows[k].append(t)
            print(f"rep {r} {k:<14} {t:.3f} s", flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\nLAT workflow: {a.lat_mib} MiB x {a.sweeps} sweeps; neighbour: CAP {a.cap_mib} MiB; node DRAM {a.pool} MiB; "
          f"median of {a.reps}; " + ("cores shared" if a.no_pin else "one core each") + f"; attuned --move-limit {a.move_limit}")
    print(f"{'environment':<16}{'alone s':>10}{'pair s':>10}{'pair/alone':>12}{'spread (pair)':>16}")
    res = {}
    for env in ("attuned", "kernel"):
        al, pr = med[f"{env} alone"], med[f"{env} pair"]
        sp = f"{min(rows[env + ' pair']):.3f}-{max(rows[env + ' pair']):.3f}"
        print(f"{env:<16}{al:>10.3f}{pr:>10.3f}{pr / al:>12.3f}{sp:>16}")
        res[env] = {"alone_s": rows[f"{env} alone"], "pair_s": rows[f"{env} pair"], "ratio": pr / al}
    if reclaims:
        print(f"reclaim when the LAT workflow arrived: median {statistics.median(reclaims):.1f} ms "
              f"(range {min(reclaims):.1f}-{max(reclaims):.1f})")
        res["reclaim_ms"] = reclaims
    dm = Daemon(d, 4096)
    try:
        for n in (1, 16, 100):
            o = subprocess.check_output([str(ATTUNE), "daemon-bench", "--socket", dm.sock, "--clients", str(n),
                                         "--seconds", "2", "--json"], text=True)
            rates = json.loads(o)
            print(f"control plane, {n:>3} clients: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rates.items()))
            res[f"control_{n}"] = rates
    finally:
        dm.stop()
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
