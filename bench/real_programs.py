"""Real programs, unmodified, at a share of their peak RSS (half by default): `attune run` (its default fault
delivery, and the handler thread for comparison) against the kernel's swap on a zram
device of ours under a cgroup memory limit of the same size, next to the program with all
the memory it wants (IE). Environments are interleaved run by run in one invocation;
every answer is checked (the program's own check, or its output's hash against IE's).
Needs root (swap and cgroups). Issue 24's benchmark; results in docs/benchmarks.md.

The limit is the share (--fractions, 0.5 by default) of the program's peak RSS under IE.
Where Attune's far memory lives (--far, as in bench/imme.py): `pool` (default) and `file`
run `attune run` in a memory cgroup at the same limit as the kernel, without kernel swap,
its far pages in the node's pool of an attuned of the harness (outside the cgroup, as the
kernel's zram device is) or in the default far tier (a file, O_DIRECT); Attune's budget is
the limit less the room: what a cgroup holds beyond the managed peaks during an
unconstrained `attune run` (bench/imme.py, `held_peak` and `room_at`). `emulated` is the accounting before 2026-11-27: no
cgroup, the far tier in the process, and the budget the limit less the program's other
memory (peak RSS less the managed peak under `attune run` without pressure).

A program of several processes (`mpi`: two Open MPI ranks under one `mpirun`) is measured
as a job: its peak is its cgroup's (all processes and MPI's shared-memory segments, as the
kernel's limit counts them), the other memory is that peak under `attune run` without
pressure less the ranks' managed peaks, and what is left of the limit is divided among
the ranks, since Attune's budget is per process.

Usage: python3 bench/real_programs.py [--reps 3] [--fractions 0.5] [--far pool]
                                     [--only numpy,igraph,zstd,sort,openmp,jemalloc,mpi,btree,java]
"""
import argparse
import hashlib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# Far tiers of the recorded figures: emulated in the process (the `memory` tier, then a
# file), as they were taken. Without a far device the default (`far = "auto"`) is a file
# on local scratch; ATTUNE_BENCH_FAR=auto measures that instead.
EMULATED = os.environ.get("ATTUNE_BENCH_FAR", "memory,file")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import imme  # noqa: E402  (the fair accounting: Far, Daemon, ROOM_SLACK)
ROOT = os.path.join(HERE, "..")
ATT = os.path.join(ROOT, "build", "bin", "attune")
PY = sys.executable


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def make_inputs(d):
    """Input files, made once per invocation (not timed)."""
    rnd = random.Random(7)
    # zstd --long: 256 MiB whose 32 MiB blocks repeat with small changes far apart.
    block = bytearray(rnd.randbytes(32 << 20))
    with open(os.path.join(d, "long.bin"), "wb") as f:
        for i in range(8):
            for _ in range(64):
                block[rnd.randrange(len(block))] = rnd.randrange(256)
            f.write(block)
    # sort: 6 M lines of random keys and payloads (about 160 MiB).
    with open(os.path.join(d, "lines.txt"), "w") as f:
        for _ in range(6_000_000 // 1000):
            f.write("".join(f"{rnd.getrandbits(48):015d} {rnd.getrandbits(32):010d}\n" for _ in range(1000)))


# Open MPI as root, two ranks on however many cores there are.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
# Processes that hold managed memory, for programs of several (the budget is per process).
RANKS = {"mpi": 2}


def programs(d):
    """name -> (argv, environment, check(stdout, workdir) -> answer or None)."""
    def line(tag):
        return lambda out, _w: tag if tag in out else None

    def zstd_check(_out, w):
        r = subprocess.run(["zstd", "-q", "-d", "-f", "--long=28", os.path.join(w, "out.zst"), "-o", os.path.join(w, "back.bin")],
                           capture_output=True)
        return r.returncode == 0 and sha(os.path.join(w, "back.bin")) == sha(os.path.join(d, "long.bin")) or None

    def sort_check(_out, w):
        return sha(os.path.join(w, "sorted.txt"))

    return {
        "numpy": ([PY, os.path.join(ROOT, "tests/run/numpy_work.py"), "256"], {}, line("numpy_work: OK")),
        "igraph": ([PY, os.path.join(HERE, "workloads/sc_bfs.py"), "256"], {}, line("RESULT sc OK")),
        "zstd": (["sh", "-c", f"zstd -q -f -T1 -3 --long=28 {d}/long.bin -o \"$W/out.zst\""], {}, zstd_check),
        "sort": (["sh", "-c", f"sort -S 1G --parallel=1 {d}/lines.txt -o \"$W/sorted.txt\""], {"LC_ALL": "C"},
                 sort_check),
        "openmp": ([os.path.join(d, "omp_stream"), "256"], {"OMP_NUM_THREADS": "2"}, line("omp_stream: OK")),
        "jemalloc": ([os.path.join(d, "allocators_jemalloc"), "256"], {}, line("allocators: OK")),
        # Two ranks of 256 MiB each exchange their buffers in 8 MiB messages and verify them.
        "mpi": (["mpirun", "-np", str(RANKS["mpi"]), os.path.join(d, "mpi_exchange"), "256"], MPI_ENV,
                line("mpi_exchange: OK ranks=2")),
        # An in-memory B-tree index build (issue 28): 8 M random keys on 4 KiB pages from a
        # pool of 64 MiB slabs, peak RSS about 230 MB.
        "btree": ([os.path.join(d, "btree_index"), "8000000"], {},
                  lambda out, _w: out.split("btree_index: OK")[-1].strip() if "btree_index: OK" in out else None),
        # The JVM's own heap, reserved and committed in place (docs/design/run.md, "Heaps
        # committed in place"): 256 MiB of arrays read back at random, then garbage.
        "java": (["java", "-XX:+UseParallelGC", "-Xmx1g", "-cp", d, "JavaHeap", "256", "4"], {},
                 line("JavaHeap: OK")),
    }


def build(d):
    subprocess.run(["gcc", "-O2", os.path.join(HERE, "workloads/btree_index.c"), "-o",
                    os.path.join(d, "btree_index")], check=True)
    subprocess.run(["gcc", "-O2", "-fopenmp", os.path.join(ROOT, "tests/run/omp_stream.c"), "-o",
                    os.path.join(d, "omp_stream")], check=True)
    subprocess.run(["gcc", "-O2", "-DUSE_JEMALLOC", os.path.join(ROOT, "tests/run/allocators.c"), "-o",
                    os.path.join(d, "allocators_jemalloc"), "-ljemalloc", "-lpthread"], check=True)
    if shutil.which("mpicc"):
        subprocess.run(["mpicc", "-O2", os.path.join(ROOT, "tests/run/mpi_exchange.c"), "-o",
                        os.path.join(d, "mpi_exchange")], check=True)
    if shutil.which("javac"):
        subprocess.run(["javac", "-d", d, os.path.join(ROOT, "tests/run/JavaHeap.java")], check=True)


def run_env(env, work):
    """A program's environment: ours, its own, W=work; a variable set to None is removed."""
    return {k: v for k, v in {**os.environ, **env, "W": work}.items() if v is not None}


def in_cgroup(cmd, env, work):
    """(held, peak) of `cmd` in a memory cgroup of ours without a limit: what it held that
    a limit cannot reclaim, and the cgroup's peak as the kernel's limit counts it (every
    process, shared memory and page cache included; bench/imme.py, `held_peak`)."""
    os.makedirs(work, exist_ok=True)
    try:
        r, held, peak = imme.held_peak(cmd, run_env(env, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if r["exit"] != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r['exit']}) in a cgroup: {r['stderr'][-600:]}")
    return held, peak


def job_peak(prefix, argv, env, work):
    """Peak memory of a whole job (every process, shared memory included) in a cgroup of
    ours without a limit, as the kernel's limit would count it."""
    return in_cgroup(prefix + argv, env, work)[1]


def once(prefix, argv, env, check, work):
    """(seconds, answer, killed, peak RSS in bytes of the largest process) of one run. A
    variable whose value is None in `env` is removed."""
    os.makedirs(work, exist_ok=True)
    e = run_env(env, work)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        p = subprocess.Popen(prefix + argv, stdout=out, stderr=err, env=e)
        _, status, ru = os.wait4(p.pid, 0)
        secs = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    rc = p.returncode
    # The kernel's OOM killer: SIGKILL of the program (kernel-swap passes 128+9 on).
    killed = rc in (137, -9)
    answer = check(stdout, work) if rc == 0 and check else None
    if rc != 0 and not killed:
        sys.exit(f"{' '.join(prefix + argv)} failed ({rc}): {stdout[-300:]} {stderr[-600:]}")
    shutil.rmtree(work, ignore_errors=True)
    return secs, answer, killed, ru.ru_maxrss * 1024


def footprint(argv, env, check, work, ranks=1, charged=False):
    """Peak RSS under IE, and the part of it Attune would not manage (a job's, for a
    program of several processes). With `charged`, that part is what a memory cgroup holds
    beyond the managed peaks and its limit could not reclaim (`in_cgroup`)."""
    _, ans, _, rss = once([], argv, env, check, work)
    if ans is None:
        sys.exit(f"{argv}: no answer")
    unpressured = [ATT, "run", "-q", "--dram", "100%"]
    job = job_peak([], argv, env, work) if ranks > 1 else rss
    if charged:
        # One unconstrained run, in a cgroup: what it holds beyond the managed peaks.
        with tempfile.NamedTemporaryFile(suffix=".json") as rep:
            held, _ = in_cgroup(unpressured + ["--report", rep.name, "--"] + argv, env, work)
            peaks = [p.get("peak_resident_bytes", 0) for p in json.load(open(rep.name))["per_process"]]
        return job, max(held - sum(peaks), 0)
    with tempfile.NamedTemporaryFile(suffix=".json") as rep:
        _, ans, _, rss_att = once(unpressured + ["--report", rep.name, "--"], argv, env, check, work)
        if ans is None:
            sys.exit(f"{argv}: no answer under attune run without pressure")
        r = json.load(open(rep.name))
    peaks = [p.get("peak_resident_bytes", 0) for p in r["per_process"]]
    if ranks > 1:
        job_att = job_peak(unpressured + ["--"], argv, env, work)
        return job, max(job_att - sum(peaks), 0)
    return rss, max(rss_att - max(peaks, default=0), 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="numpy,igraph,zstd,sort,openmp,jemalloc")
    ap.add_argument("--fractions", default="0.5", help="limits as shares of the IE peak RSS, comma-separated")
    ap.add_argument("--skip-thread", action="store_true", help="leave out attune run under thread delivery")
    ap.add_argument("--far", choices=imme.FARS, default="pool",
                    help="Attune's far memory: pool (attuned's, outside the job's cgroup), file (the default far "
                         "tier, in the cgroup's limit) or emulated (in the process, no cgroup)")
    a = ap.parse_args()
    if a.far == "pool" and not os.path.exists(imme.ATTUNED):
        sys.exit(f"{imme.ATTUNED} not found: run `make build` first")
    cols = ["IE (s)", "attune run"] + ([] if a.skip_thread else ["attune run (thread)"]) + ["kernel swap (zram)"]
    print("| program | IE peak RSS (MiB) | limit (MiB) | attune budget (MiB) | " + " | ".join(cols)
          + " | kernel / attune |")
    print("|---" * (len(cols) + 5) + "|", flush=True)
    d = tempfile.mkdtemp(prefix="attune-real-")
    far = imme.Far(a.far, d)
    try:
        make_inputs(d)
        build(d)
        progs = programs(d)
        rows = []
        jobs = []
        for name in a.only.split(","):
            argv, env, check = progs[name]
            work = os.path.join(d, "w")
            if name == "mpi" and not os.path.exists(argv[3]):
                sys.exit("mpi: mpicc not found (scripts/setup.sh installs Open MPI)")
            foot, other = footprint(argv, env, check, work, RANKS.get(name, 1), a.far != "emulated")
            for frac in map(float, a.fractions.split(",")):
                jobs.append((name, argv, env, check, work, foot, other, frac))
        for name, argv, env, check, work, foot, other, frac in jobs:
            limit = int(foot * frac)
            room = imme.room_at(other, foot, limit) if a.far != "emulated" else other
            # Per process: a job's budget is divided among its ranks.
            budget = max((limit - room) // RANKS.get(name, 1), 16 << 20)
            att = [ATT, "run", "-q", "--dram", f"{budget >> 20}M"]
            if a.far == "emulated":
                att += ["--far", EMULATED]
            else:
                att = [ATT, "kernel-swap", "--limit", f"{limit >> 20}M", "--swap", "none", "--"] + att
            envs = {
                "IE": [],
                "attune run": att + ["--"],
                "attune run (thread)": att + ["--fault-mode", "thread", "--"],
                "kernel swap (zram)": [ATT, "kernel-swap", "--limit", f"{limit >> 20}M", "--swap", "memory", "--"],
            }
            # The harness names Attune's far tiers (its pool's, or auto's) and the room.
            fenv = far.env("IMME", room)
            att_env = {k: fenv.get(k) for k in ("ATTUNE_LIMIT_ROOM", "ATTUNE_DAEMON", "ATTUNE_CONFIG", "ATTUNE_FAR")}
            if a.skip_thread:
                del envs["attune run (thread)"]
            times = {k: [] for k in envs}
            answers, kills = {}, {k: 0 for k in envs}
            for _ in range(a.reps):
                for k, prefix in envs.items():
                    daemon = far.start(limit) if k.startswith("attune") else None
                    e = {**env, **att_env} if k.startswith("attune") else env
                    if daemon:
                        e["ATTUNE_SOCKET"] = daemon.sock
                    try:
                        secs, ans, killed, _ = once(prefix, argv, e, check, work)
                    finally:
                        if daemon:
                            daemon.stop()
                    if killed:
                        kills[k] += 1
                        continue
                    if ans is None:
                        sys.exit(f"{name} under {k}: wrong answer")
                    answers.setdefault(ans, []).append(k)
                    times[k].append(secs)
            if len(answers) != 1:
                sys.exit(f"{name}: answers differ between environments: {answers}")
            rows.append((name, foot, limit, budget, times, kills))
            ie = statistics.median(times["IE"])
            att = statistics.median(times["attune run"]) if times["attune run"] else None
            print(f"| {name} | {foot >> 20} | {limit >> 20} ({frac:.0%}) | {budget >> 20} | " + " | ".join(
                (f"{statistics.median(v):.2f} ({statistics.median(v) / ie:.2f}x)" if v else "OOM-killed")
                + (f", {kills[k]} killed" if kills[k] and v else "")
                for k, v in times.items()) + " | " + (
                f"{statistics.median(times['kernel swap (zram)']) / att:.2f}x" if times["kernel swap (zram)"] and att
                else "-")
                + " |", flush=True)
        ratios = [statistics.median(t["kernel swap (zram)"]) / statistics.median(t["attune run"])
                  for _, _, _, _, t, _ in rows if t["kernel swap (zram)"] and t["attune run"]]
        if ratios:
            g = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"\ngeometric mean of kernel swap over attune run, where the kernel finished: {g:.2f}x")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
