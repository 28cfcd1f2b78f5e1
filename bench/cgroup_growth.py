"""How close programs under a memory cgroup come to its limit, and how often the kernel
kills them there: the figures behind docs/design/paging.md, "Budgets under a memory
cgroup" and "Several runtimes in one group". Real cgroup v1 groups; needs root (the
programs run as `--user`, nobody by default, as HPC users are not root).

Scenarios (`--scenario`):
  heap  tests/python/test_cgroup_limit.py's Python program in a 160 MiB group with
        `--dram 1G`: it fills a 112 MiB buffer (managed), then its own heap grows by
        about 70 MiB at once outside Attune. Nothing but the runtime's readings of the
        group stands between that growth and the limit.
  fill  `--programs` `attune run` programs of tests/run/rand_update (`--mib`, 80) started
        at once in one 256 MiB group, on an attuned whose DRAM (512 MiB) is wider than
        the group, with the node pool then a direct file as far tiers
        (tests/python/test_pool.py's `fill_together`). Also the most any runtime read
        as held outside the group's runtimes' pages (its report's
        `cgroup_outside_peak_bytes`): its program's own memory, if it knows its peers.

`--burn K` runs K CPU-bound loops beside each run (CI has 2 cores and a busy machine).
`--baseline DIR` is another build's prefix (its bin/attune, bin/attuned): the two
alternate run by run, so both see the same machine.

Usage: python3 bench/cgroup_growth.py [--scenario heap|fill] [--runs 30] [--burn 4]
           [--programs 8] [--mib 80] [--user nobody] [--baseline /path/to/old/build]
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))
from test_cgroup_limit import GROW  # noqa: E402  the program the test runs
from test_pool import CGROUP_ROOT as CGROUP, Cgroup as Group  # noqa: E402  the tests' groups

MIB = 1 << 20


def as_user(user, argv):
    return ["runuser", "-u", user, "--", *map(str, argv)] if user != "root" else list(map(str, argv))


def clean_env(**kw):
    e = {k: v for k, v in os.environ.items() if not k.startswith("ATTUNE_")}
    e.update(TMPDIR="/tmp", **{k: str(v) for k, v in kw.items()})
    return e


def heap_run(prefix, work, user, i):
    """One run of the heap scenario: (group peak, processes killed, seconds, verified)."""
    g = Group(f"heap{i}", 160 * MIB)
    try:
        t = time.perf_counter()
        p = subprocess.run(g.wrap(as_user(user, [prefix / "bin/attune", "run", "-q", "--dram", "1G", "--",
                                                 "/usr/bin/python3", work / "grow.py", "112", "1100000", "1", "0"])),
                           env=clean_env(ATTUNE_DAEMON="off", ATTUNE_FAR="auto"),
                           capture_output=True, text=True, timeout=300)
        dt = time.perf_counter() - t
        return g.peak(), g.oom_kills(), dt, p.returncode == 0 and "grow: bad 0" in p.stdout, 0
    finally:
        g.remove()


def start_daemon(prefix, work):
    sock = work / f"d{time.monotonic_ns()}.sock"
    log = open(work / "attuned.log", "a")
    d = subprocess.Popen([prefix / "bin/attuned", "--socket", sock, "--metrics", "off", "--dram", "512M",
                          "--far-pool", "2G", "--move-limit", "off"], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(200):
        try:
            socket.socket(socket.AF_UNIX).connect(str(sock))
            return d, sock
        except OSError:
            time.sleep(0.02)
    d.kill()
    sys.exit("attuned did not start: see " + str(work / "attuned.log"))


def fill_run(prefix, work, user, i, n, mib):
    """One run of the fill scenario: (group peak, processes killed, seconds, all verified,
    the most any runtime read as held outside its group's runtimes' pages)."""
    d, sock = start_daemon(prefix, work)
    g = Group(f"fill{i}", 256 * MIB)
    reps = [work / f"fill{i}-{k}.json" for k in range(n)]
    try:
        t = time.perf_counter()
        jobs = [subprocess.Popen(g.wrap(as_user(user, [prefix / "bin/attune", "run", "-q", "--dram", "512M",
                                                       "--config", work / "pool.toml", "--report", reps[k], "--",
                                                       work / "rand_update", str(mib), "400000"])),
                                 env=clean_env(ATTUNE_SOCKET=sock, ATTUNE_WORKFLOW=f"b{i}-{k}"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for k in range(n)]
        ok = True
        for j in jobs:
            out, _ = j.communicate(timeout=300)
            ok &= j.returncode == 0 and "rand_update: OK" in out
        dt = time.perf_counter() - t
        outside = 0
        for r in reps:
            try:
                outside = max(outside, json.loads(r.read_text())["per_process"][0]["cgroup_outside_peak_bytes"])
            except (OSError, ValueError, KeyError, IndexError):
                pass
        return g.peak(), g.oom_kills(), dt, ok, outside
    finally:
        g.remove()
        d.send_signal(signal.SIGTERM)
        d.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", choices=["heap", "fill"], default="heap")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--burn", type=int, default=0, help="CPU-bound loops beside each run")
    ap.add_argument("--programs", type=int, default=8, help="fill: programs in the group")
    ap.add_argument("--mib", type=int, default=80, help="fill: MiB each program fills")
    ap.add_argument("--user", default="nobody", help="who runs the programs (root: root)")
    ap.add_argument("--baseline", type=Path, help="another build's prefix, alternated run by run")
    a = ap.parse_args()
    if os.geteuid() != 0 or not (CGROUP / "memory.limit_in_bytes").exists():
        sys.exit("needs root and the cgroup v1 memory controller")
    builds = {"this build": ROOT / "build"}
    if a.baseline:
        builds["baseline"] = a.baseline.resolve()
    work = Path(tempfile.mkdtemp(prefix="attune-cgbench-"))
    os.chmod(work, 0o777)  # the user writes the file tier there
    (work / "grow.py").write_text(GROW)
    subprocess.run(["gcc", "-O2", ROOT / "tests/run/rand_update.c", "-o", work / "rand_update"], check=True)
    (work / "pool.toml").write_text(f"""
[[tier]]
name = "pool"
kind = "pool"
capacity = "512M"

[[tier]]
name = "file"
kind = "file"
path = "{work}"
capacity = "1G"
direct = true
""")
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.burn)]
    rows = {k: [] for k in builds}
    try:
        for i in range(a.runs):
            for name, prefix in builds.items():
                r = heap_run(prefix, work, a.user, i) if a.scenario == "heap" else \
                    fill_run(prefix, work, a.user, i, a.programs, a.mib)
                rows[name].append(r)
                print(f"{name:10s} run {i}: peak {r[0] / MIB:.0f} MiB, killed {r[1]}, {r[2]:.2f} s,"
                      f" {'verified' if r[3] else 'FAILED'}", flush=True)
    finally:
        for b in burners:
            b.kill()
        shutil.rmtree(work, ignore_errors=True)
    limit = 160 if a.scenario == "heap" else 256
    what = "heap" if a.scenario == "heap" else f"fill, {a.programs} programs of {a.mib} MiB"
    print(f"\n{what}, limit {limit} MiB, as {a.user}, {a.burn} CPU loops beside, {a.runs} runs")
    print("| build | group peak MiB (min / median / max) | runs with a kill | processes killed | seconds (median) |"
          " held outside, MiB (most a runtime read; median / max) |")
    print("|---|---|---|---|---|---|")
    for name, rs in rows.items():
        peaks = [r[0] / MIB for r in rs]
        print(f"| {name} | {min(peaks):.0f} / {statistics.median(peaks):.0f} / {max(peaks):.0f} |"
              f" {sum(1 for r in rs if r[1])} | {sum(r[1] for r in rs)} |"
              f" {statistics.median(r[2] for r in rs):.2f} |"
              f" {statistics.median(r[4] for r in rs) / MIB:.0f} / {max(r[4] for r in rs) / MIB:.0f} |")


if __name__ == "__main__":
    main()
