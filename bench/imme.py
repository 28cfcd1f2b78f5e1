"""IMME's evaluation on this machine (issue: the main job): real workflows run in four
execution environments at the same DRAM budget, checked for correctness, timed, and
reported as a table, JSON, plots and a docs/benchmarks.md section.

Environments (IMME section IV-C3):
  IE        the program with all the memory it wants;
  CBE-mem   a cgroup memory limit at the budget, kernel swap on a memory medium (a zram device of ours);
  CBE-disk  the same with a swap file on disk;
  TME       `attune run`, temperature-only policy (flags ignored);
  IMME      `attune run` with the workflow's flags as a user would pass them.
The budget is the IE footprint (peak RSS) times (1 - outside).

Where Attune's far memory lives (--far), issue 25's fair accounting:
  pool      (default; root) TME and IMME run in a memory cgroup limited to the budget, as
            CBE does, without kernel swap (`attune kernel-swap --swap none`); their far
            pages go to the node's pool held by an attuned of the harness, outside the
            job's cgroup as CBE's swap device is, then to a file (O_DIRECT);
  file      the same cgroup, and the far tier `attune run` picks by itself on a node
            without a pool or far device (`far = "auto"`: a file on local scratch, O_DIRECT);
  emulated  no cgroup; the in-process `memory` tier then a file (the accounting of the
            tables before 2026-11-28): the far memory stays in the process, so Attune is
            given only what the budget leaves after the program's unmanaged part.
In a cgroup, Attune's DRAM budget is the limit less its room (`limit_room`): what the
program holds outside Attune's regions under `attune run` (interpreter, small objects,
the runtime itself; measured in an unconstrained run, `held_peak`), 4 MiB for the
runtime's moving parts and 1/64 of the far part (`room_at`). Without root, --far pool and file fall back to emulated, with a message.

Usage: python3 bench/imme.py [--reps 3] [--outside 0.5] [--only NAMES] [--sweep] [--far pool]
                             [--chunks] [--quick] [--out results] [--update-docs]
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import random

# Far tiers of the recorded figures: emulated in the process (the `memory` tier, then a
# file), as they were taken. Without a far device the default (`far = "auto"`) is a file
# on local scratch; ATTUNE_BENCH_FAR=auto measures that instead.
EMULATED = os.environ.get("ATTUNE_BENCH_FAR", "memory,file")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ATT = os.environ.get("ATTUNE_BIN") or os.path.join(ROOT, "build", "bin", "attune")
ATTUNED = os.path.join(os.path.dirname(ATT), "attuned")
FARS = ("pool", "file", "emulated")
# What a cgroup's room holds beyond the measured part outside Attune: what moves while the
# budget is full (the evictor's batch in flight, staging). 8 MiB left every job's peak 5-9
# MiB under its limit, 2 MiB let SC touch it (the kernel then drops page cache): 4 MiB
# (docs/design/evaluation.md; ATTUNE_BENCH_ROOM_SLACK to try others).
ROOM_SLACK = int(os.environ.get("ATTUNE_BENCH_ROOM_SLACK", 4 << 20))


def room_at(held, footprint, limit):
    """The room under `limit` of a program that holds `held` outside its managed regions:
    that, ROOM_SLACK, and 1/64 of what goes far (the runtime's tables and the page tables
    of its far mappings grow with it: numpy at 314 MiB of a 337 MiB limit with 348 MiB
    in the pool and a file peaked 5.6 MiB above its unconstrained held memory, and was
    killed by the limit with 4 MiB of slack)."""
    return held + ROOM_SLACK + max(footprint - limit, 0) // 64
W = os.path.join(HERE, "workloads")
PY = sys.executable
# Flags as the workflows' users pass them, never what an earlier `attune profile` of the
# same program taught `attune run`.
os.environ["ATTUNE_HISTORY"] = "off"

# name, class, kind (c|py), source, size MiB (default, quick), flags a user would pass
WORKLOADS = [
    ("dl", "DL: surrogate training (MLP)", "py", "dl_mlp.py", (128, 32), "BW"),
    ("dm", "DM: census ETL, diversity index", "py", "dm_diversity.py", (128, 32), "LAT"),
    ("dc", "DC: zstd, long window", "py", "dc_compress.py", (128, 32), "CAP"),
    ("sc", "SC: igraph BFS, binary tree", "py", "sc_bfs.py", (128, 32), "SHL"),
    ("stream", "stream triad", "c", "stream.c", (384, 64), "BW"),
    ("gups", "random updates (GUPS)", "c", "gups.c", (64, 16), "LAT"),
    ("xsbench", "XSBench-like lookups", "c", "xsbench.c", (128, 16), "LAT"),
    ("bfs", "Graph500 BFS (Kronecker)", "c", "bfs.c", (128, 16), "LAT"),
    ("dgemm", "DGEMM (blocked)", "c", "dgemm.c", (48, 16), "BW"),
]
ENVS = ["IE", "CBE-mem", "CBE-disk", "TME", "IMME"]


def progress(total):
    try:
        from tqdm import tqdm
        return tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)
    except ImportError:
        class Bar:
            n = 0

            def update(self, k=1):
                self.n += k
                print(f"\r[{self.n}/{total}]", end="", file=sys.stderr, flush=True)

            def set_description(self, d):
                print(f"\r[{self.n}/{total}] {d:<40}", end="", file=sys.stderr, flush=True)

            def close(self):
                print(file=sys.stderr)
        return Bar()


def vmstat():
    v = {}
    with open("/proc/vmstat") as f:
        for line in f:
            k, x = line.split()
            v[k] = int(x)
    return v


def run(cmd, env=None):
    """Runs cmd; returns (wall, ok, result line, rusage, swapped pages)."""
    before = vmstat()
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = p.communicate()
    wall = time.perf_counter() - t
    # communicate() reaped the child; its resources are in RUSAGE_CHILDREN deltas, which
    # wait4 would give per child: run through wait4 instead.
    return wall, out.decode(), err.decode(), p.returncode, before


def run_wait4(cmd, env=None, limit=None):
    """Runs cmd; `limit` seconds at most (then SIGTERM, which attune run and attune
    kernel-swap pass on and clean up after, and SIGKILL 30 s later): the run is "cut"."""
    before = vmstat()
    t = time.perf_counter()
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env)
        try:
            status, ru, cut = wait_run(p, t, limit)
        except BaseException:
            # The harness is being interrupted: stop the run (attune run and attune
            # kernel-swap clean up on SIGTERM) before the partial results are written.
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            raise
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read(), fe.read()
    return finish_run(p, t, before, out, err, ru, cut)


def wait_run(p, t, limit):
    """Reaps p with its own rusage; past `limit` seconds, SIGTERM then SIGKILL 30 s later."""
    if not limit:
        _, status, ru = os.wait4(p.pid, 0)
        return status, ru, False
    # Poll (5 ms) so the run can be stopped; wait4 reaps it with its own rusage.
    cut = False
    kill_at = None
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            return status, ru, cut
        now = time.perf_counter()
        if not cut and now - t > limit:
            cut = True
            p.send_signal(signal.SIGTERM)
            kill_at = now + 30
        elif kill_at and now > kill_at:
            p.kill()
            kill_at = None
        time.sleep(0.005)


def finish_run(p, t, before, out, err, ru, cut):
    wall = time.perf_counter() - t
    after = vmstat()
    line = next((l for l in out.decode().splitlines() if l.startswith("RESULT ")), "")
    minflt, majflt = ru.ru_minflt, ru.ru_majflt
    # attune kernel-swap reports the program's own wall time and faults: its set-up and
    # tear-down (a 4 GiB memory-backed swap file locked in memory: about a million minor
    # faults and a second or more) belong to the environment, not to the workflow.
    m = re.search(r"attune kernel-swap: .*? ([0-9.]+) s wall.*program faults: (\d+) minor, (\d+) major", err.decode())
    if m:
        wall, minflt, majflt = float(m.group(1)), int(m.group(2)), int(m.group(3))
    # The job's cgroup at its peak (CBE, and Attune's runs in a cgroup): within the limit.
    pk = re.search(r"attune kernel-swap: .*cgroup peak ([0-9.]+) (KiB|MiB|GiB|B) of a", err.decode())
    cgroup_peak = int(float(pk.group(1)) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[pk.group(2)]) if pk else None
    ok = p.returncode == 0 and " OK " in line and not cut
    # `attune kernel-swap` could not set up its swap device or cgroup (not enough disk for
    # the swap file, ...): the environment is missing, the workflow did not fail.
    setup = re.search(r"attune kernel-swap: (?:swap|cgroup|cannot set up kernel swap): (.*)", err.decode())
    return {
        "setup_failed": setup.group(1).strip() if setup and p.returncode == 2 else None,
        "wall": wall, "ok": ok, "exit": p.returncode, "result": line, "cut": cut, "cgroup_peak": cgroup_peak,
        "maxrss": ru.ru_maxrss * 1024, "majflt": majflt, "minflt": minflt,
        "pswpin": after["pswpin"] - before["pswpin"], "pswpout": after["pswpout"] - before["pswpout"],
        "stderr": err.decode()[-2000:],
    }


def build(tmp):
    exes = {}
    for name, _, kind, src, _, _ in WORKLOADS:
        if kind == "c":
            exe = os.path.join(tmp, name)
            subprocess.run(["gcc", "-O2", "-I", W, os.path.join(W, src), "-o", exe], check=True)
            exes[name] = [exe]
        else:
            exes[name] = [PY, os.path.join(W, src)]
    return exes


def mb(b):
    return f"{max(int(b) >> 20, 4)}M"


def env_cmd(envname, prog, total_budget, managed_budget, flags, chunk=None, report=None, far="emulated"):
    if envname == "IE":
        return prog
    if envname.startswith("CBE"):
        medium = "memory" if envname == "CBE-mem" else "disk"
        return [ATT, "kernel-swap", "--limit", mb(total_budget), "--swap", medium, "--swap-size", "4G", "--"] + prog
    cmd = [ATT, "run", "-q", "--dram", mb(managed_budget)]
    if far == "emulated":
        cmd += ["--far", EMULATED]
    else:
        # The job's cgroup at the budget, as CBE's, with no kernel swap: the far memory is
        # Attune's, outside the cgroup (the pool's tiers come from ATTUNE_CONFIG).
        cmd = [ATT, "kernel-swap", "--limit", mb(total_budget), "--swap", "none", "--"] + cmd
    if chunk:
        cmd += ["--chunk", chunk]
    if report:
        cmd += ["--report", report]
    if envname == "IMME":
        cmd += ["--flags", flags]
    return cmd + ["--"] + prog


class Far:
    """Where TME and IMME put their far memory (--far), and its set-up: for `pool` an
    attuned of the harness on a private socket, started for each run (an empty pool, and no
    grant of an earlier run left) and stopped after it, in the harness's own cgroup."""

    def __init__(self, kind, tmp):
        self.kind, self.tmp = kind, tmp

    def env(self, envname, room):
        e = dict(os.environ)
        if envname == "TME":
            e["ATTUNE_MODE"] = "temperature"
        if self.kind != "emulated":
            e["ATTUNE_LIMIT_ROOM"] = mb(room)
            # The harness names the far tiers; a caller's would conflict or measure others.
            e.pop("ATTUNE_FAR", None)
            e.pop("ATTUNE_CONFIG", None)
        if self.kind == "file":
            e["ATTUNE_DAEMON"] = "off"      # `auto` then takes a file on local scratch
        if self.kind == "pool":
            e.update(ATTUNE_CONFIG=pool_config(self.tmp), ATTUNE_DAEMON="require")
        return e

    def start(self, size):
        """The node pool for one run: returns the attuned process (None without a pool)."""
        if self.kind != "pool":
            return None
        return Daemon(self.tmp, dram=max(size, 64 << 20), far_pool=4 * size + (64 << 20), move_limit="off")


class Daemon:
    """attuned on a private socket in the harness's cgroup (never a job's), with `dram` to
    grant and `far_pool` of node pool. With `sample`, its status is read every 0.1 s: the
    DRAM each workflow was granted (median and peak over the samples that listed it)."""

    def __init__(self, tmp, dram, far_pool=None, move_limit="1G", bw_dram_share=100, sample=False):
        self.sock = os.path.join(tmp, f"attuned-{random.randrange(1 << 30)}.sock")
        far = ["--far-pool", mb(far_pool)] if far_pool else []
        self.p = subprocess.Popen([ATTUNED, "--socket", self.sock, "--dram", mb(dram), "--metrics", "off",
                                   "--min-grant", "8M", "--bw-dram-share", str(bw_dram_share),
                                   "--move-limit", move_limit, *far],
                                  stderr=subprocess.DEVNULL)
        for _ in range(250):
            if os.path.exists(self.sock):
                break
            time.sleep(0.02)
        else:
            self.p.terminate()
            self.p.wait()
            raise RuntimeError("attuned did not start")
        self.grants = {}
        self.done = threading.Event()
        self.sampler = threading.Thread(target=self.sample, daemon=True) if sample else None
        if self.sampler:
            self.sampler.start()

    def sample(self):
        while not self.done.wait(0.1):
            r = subprocess.run([ATT, "status", "--json", "--socket", self.sock], capture_output=True, text=True)
            if r.returncode != 0:
                continue
            try:
                for w in json.loads(r.stdout)["workflows"]:
                    self.grants.setdefault(w["name"], []).append(w["grant"])
            except (ValueError, KeyError):
                continue

    def stop(self):
        self.done.set()
        if self.sampler:
            self.sampler.join()
        self.p.terminate()
        self.p.wait()
        return {n: {"median": statistics.median(g), "peak": max(g)} for n, g in self.grants.items()}


def pool_config(tmp):
    """Tiers on a node with attuned's pool: the pool, then a file (O_DIRECT: no page cache
    charged to the job) for what the pool cannot take."""
    p = os.path.join(tmp, "pool.toml")
    if not os.path.exists(p):
        with open(p, "w") as f:
            f.write('[[tier]]\nname = "pool"\nkind = "pool"\ncapacity = "8G"\n\n'
                    f'[[tier]]\nname = "file"\nkind = "file"\npath = "{tmp}"\ncapacity = "8G"\ndirect = true\n')
    return p


def measure(envname, prog, total, managed, flags, reps, bar, label, chunk=None, limit=None, far=None, room=0,
            held=0):
    far = far or Far("emulated", None)
    why = no_room(far.kind, total, held) if envname in ("TME", "IMME") else None
    if why:
        bar.update(reps)
        return {"ok": False, "median": float("nan"), "min": float("nan"), "max": float("nan"),
                "majflt": 0, "minflt": 0, "moved_pages": 0, "cgroup_peak": None, "result": "",
                "errors": [why], "oom_killed": False, "cut": False, "setup_failed": None, "no_room": why}
    runs = []
    for _ in range(reps):
        rep = tempfile.mktemp(suffix=".json")
        attune = envname in ("TME", "IMME")
        cmd = env_cmd(envname, prog, total, managed, flags, chunk, rep if attune else None,
                      far.kind if attune else "emulated")
        bar.set_description(f"{label} {envname}")
        env = far.env(envname, room) if attune else None
        daemon = far.start(total) if attune else None
        if daemon:
            env["ATTUNE_SOCKET"] = daemon.sock
        try:
            r = run_wait4(cmd, env, limit)
        finally:
            if daemon:
                daemon.stop()
        rj = None
        if attune and os.path.exists(rep):
            try:
                with open(rep) as f:
                    rj = json.load(f)
            except ValueError:
                rj = None     # a cut run may leave a partial report
            os.unlink(rep)
        if rj:
            r["moved_pages"] = rj["totals"]["moved_bytes"] // 4096
            r["attune_faults"] = rj["totals"]["faults"]
        else:
            r["moved_pages"] = r["pswpin"] + r["pswpout"] if envname.startswith("CBE") else 0
        runs.append(r)
        if r["cut"] or r.get("setup_failed"):
            # One cut run (or a missing environment) says enough: the others would be too.
            bar.update(reps - len(runs) + 1)
            break
        bar.update()
    ok = all(r["ok"] for r in runs)
    walls = [r["wall"] for r in runs]
    return {
        "ok": ok, "median": statistics.median(walls), "min": min(walls), "max": max(walls),
        "majflt": statistics.median(r["majflt"] for r in runs),
        "minflt": statistics.median(r["minflt"] for r in runs),
        "moved_pages": statistics.median(r["moved_pages"] for r in runs),
        "cgroup_peak": max((r["cgroup_peak"] for r in runs if r.get("cgroup_peak")), default=None),
        "result": runs[-1]["result"], "errors": [r["stderr"] for r in runs if not r["ok"]][:1],
        # The kernel's OOM killer (SIGKILL), as the paper's "would otherwise crash".
        "oom_killed": any(not r["ok"] and not r["cut"] and (r["exit"] == -9 or "signal 9" in r["stderr"]) for r in runs),
        "cut": any(r["cut"] for r in runs),
        "setup_failed": next((r["setup_failed"] for r in runs if r.get("setup_failed")), None),
    }


# The least DRAM budget a run under Attune is given (attune_budget's floor).
MIN_ATTUNE_BUDGET = 8 << 20


def no_room(far_kind, budget, held):
    """Why Attune cannot run in the job's limit, or None: what the program holds outside
    Attune's regions (interpreter, small objects, libraries) must fit under the limit with
    the least budget; past it the kernel kills the program whatever Attune does (a run
    would only say OOM-killed). Emulated far memory is outside every limit: never."""
    if far_kind == "emulated" or held + MIN_ATTUNE_BUDGET <= budget:
        return None
    return (f"{held / 2**20:.0f} MiB held outside Attune's regions against a "
            f"{budget / 2**20:.0f} MiB limit")


def failure(x):
    """What kept a measured environment from a time, as the table says it, or None: one
    order for the table, the plots and the summary on stderr."""
    if not x or x.get("ok"):
        return None if x else "FAILED"
    return ("n/a (set-up)" if x.get("setup_failed") else "no room" if x.get("no_room")
            else "OOM-killed" if x.get("oom_killed") else "cut" if x.get("cut") else "FAILED")


def attune_budget(far_kind, budget, unmanaged, room):
    """Attune's DRAM budget at a total budget: in the job's cgroup, the limit less the room
    (what the process holds outside its regions, the runtime's moving parts); emulated,
    what the budget leaves after the program's unmanaged part alone (its far tier is in
    the process, outside any limit)."""
    if far_kind == "emulated":
        return max(budget - unmanaged, MIN_ATTUNE_BUDGET)
    return max(budget - room, MIN_ATTUNE_BUDGET)


CGROUP_ROOT = "/sys/fs/cgroup/memory"


def held_peak(cmd, env=None):
    """Runs `cmd` in a memory cgroup of the harness without a limit; returns the run (as
    run_wait4), the cgroup's own peak (page cache included, as a limit counts it), and the
    peak of what the cgroup held that a limit without swap cannot take
    back without harm: anonymous and shmem pages, and file pages mapped into the program
    (its libraries' code and data, in use; memory.stat `total_rss` + `total_shmem` +
    `total_mapped_file`, sampled every 5 ms, or the cgroup's peak less the page cache
    left charged at the end, whichever is larger). Page cache that is only cached is left
    out (the input sort reads): under the limit the kernel drops it first, for Attune's
    runs as for CBE's."""
    g = os.path.join(CGROUP_ROOT, f"attune-held-{os.getpid()}-{random.randrange(1 << 30)}")
    os.mkdir(g)
    peak = [0]
    done = threading.Event()

    def sample():
        while True:
            try:
                st = dict(line.split() for line in open(os.path.join(g, "memory.stat")))
                peak[0] = max(peak[0], sum(int(st.get(k, 0)) for k in ("total_rss", "total_shmem", "total_mapped_file")))
            except (OSError, ValueError):
                pass
            if done.wait(0.005):
                return

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        r = run_wait4(["sh", "-c", f'echo $$ > {g}/cgroup.procs && exec "$@"', "sh"] + cmd, env)
        # Sampling can miss a short peak (DM's held memory came out 5 MiB lower in one run
        # of two, and IMME was killed by its limit): the cgroup's true peak less the page
        # cache still charged to it at the end (no longer mapped: what a limit reclaims)
        # bounds it from the other side; the larger of the two counts.
        st = dict(line.split() for line in open(os.path.join(g, "memory.stat")))
        cached = int(st.get("total_cache", 0)) - int(st.get("total_shmem", 0))
        top = int(open(os.path.join(g, "memory.max_usage_in_bytes")).read())
    finally:
        done.set()
        t.join()
        remove_cgroup(g)
    return r, max(peak[0], top - cached), top


def remove_cgroup(g):
    """Removes a cgroup of ours once its processes are gone (retried while the kernel
    settles)."""
    for _ in range(50):
        try:
            os.rmdir(g)
            return
        except OSError:
            time.sleep(0.1)


def footprint(prog, bar, label, cgroup=False):
    """Peak RSS alone, the managed part's peak under `attune run`, the IE time, and what
    the process holds outside its managed regions under `attune run` (the runtime
    included). With `cgroup`, that part is what a memory cgroup holds beyond the managed
    peak and could not reclaim (`held_peak`): the RSS counts library pages an earlier
    process brought in, which a new cgroup is not charged for, and the cgroup's own peak
    counts page cache, which a limit reclaims."""
    bar.set_description(f"{label} footprint")
    ie = run_wait4(prog)
    rep = tempfile.mktemp(suffix=".json")
    bar.set_description(f"{label} managed share")
    cmd = [ATT, "run", "-q", "--dram", "100%", "--report", rep, "--"] + prog
    r, held, _ = held_peak(cmd) if cgroup else (run_wait4(cmd), 0, 0)
    managed = 0
    if os.path.exists(rep):
        with open(rep) as f:
            managed = json.load(f)["totals"]["peak_resident_bytes_max"]
        os.unlink(rep)
    bar.update(2)
    if not ie["ok"] or not r["ok"]:
        raise RuntimeError(f"{label}: the unconstrained run failed: {ie['stderr']}{r['stderr']}")
    return ie["maxrss"], min(managed, ie["maxrss"]), ie["wall"], max((held if cgroup else r["maxrss"]) - managed, 0)


def plots(res, out, sweep, chunks):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots", file=sys.stderr)
        return []
    made = []

    def save(fig, name):
        fig.tight_layout()
        for ext in ("png", "svg"):
            p = os.path.join(out, f"{name}.{ext}")
            fig.savefig(p)
            made.append(p)
        plt.close(fig)

    names = [w for w in res["workloads"] if res["workloads"][w]["envs"]]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(ENVS)
    for k, e in enumerate(ENVS):
        xs = [res["workloads"][w]["envs"].get(e, {}) for w in names]
        # A failed or OOM-killed run has no time: no bar, a mark instead.
        vals = [x["normalized"] if x.get("ok") else float("nan") for x in xs]
        pos = [i + k * width for i in range(len(names))]
        ax.bar(pos, vals, width, label=e)
        for p, x in zip(pos, xs):
            if x and not x.get("ok"):
                mark = {"OOM-killed": "OOM", "FAILED": "X"}.get(failure(x), failure(x))
                ax.text(p, 1.0, mark, rotation=90, fontsize=7, ha="center", va="bottom")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names)
    ax.set_ylabel("time / IE time")
    ax.set_title(f"Figure 5 on this machine: {int(res['outside'] * 100)}% of the footprint outside DRAM")
    ax.legend(ncol=5, fontsize=8)
    ax.set_yscale("log")
    save(fig, "imme-fig5")
    # Figure 9: the kernel's major faults (swap-ins) and the pages each environment moved
    # between tiers (Attune resolves its faults in user space: minor for the kernel).
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, key, label in ((axes[0], "majflt", "major page faults + 1"),
                           (axes[1], "moved_pages", "4 KiB pages moved + 1")):
        for k, e in enumerate(ENVS[1:]):
            vals = [res["workloads"][w]["envs"].get(e, {}).get(key, 0) + 1 for w in names]
            ax.bar([i + k * 0.2 for i in range(len(names))], vals, 0.2, label=e)
        ax.set_xticks([i + 0.3 for i in range(len(names))], names, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel(label)
    axes[0].set_title("Figure 9 on this machine: major faults")
    axes[1].set_title("pages moved between tiers")
    axes[0].legend(fontsize=8)
    save(fig, "imme-fig9")
    if sweep:
        fig, ax = plt.subplots(figsize=(8, 4))
        for w, pts in sweep.items():
            for e in ("TME", "IMME", "CBE-mem"):
                xs = [p["outside"] * 100 for p in pts if e in p]
                ys = [p[e] for p in pts if e in p]
                ax.plot(xs, ys, marker="o", label=f"{w} {e}")
        ax.set_xlabel("% of footprint outside DRAM")
        ax.set_ylabel("time / IE time")
        ax.set_title("Figure 6 on this machine")
        ax.legend(fontsize=7)
        save(fig, "imme-fig6")
    if chunks:
        fig, ax = plt.subplots(figsize=(8, 4))
        for w, pts in chunks.items():
            ax.plot([p["chunk"] for p in pts], [p["normalized"] for p in pts], marker="o", label=w)
        ax.set_xlabel("chunk size")
        ax.set_ylabel("time / IE time")
        ax.set_title("rMap Figure 6 on this machine: chunk size")
        ax.legend()
        save(fig, "imme-chunks")
    return made


FAR_TEXT = {
    "pool": "; Attune (TME, IMME) in a cgroup at the budget as CBE, without kernel swap, its far pages in the node's "
            "pool held by attuned outside the cgroup, then a file (`--far pool`)",
    "file": "; Attune (TME, IMME) in a cgroup at the budget as CBE, without kernel swap, its far tier the default "
            "(`far = \"auto\"`: a file on local scratch, O_DIRECT; `--far file`)",
    "emulated": "; Attune's far tier in its own process, outside any limit, and its DRAM budget what the budget "
                "leaves after the program's unmanaged part (`--far emulated`)",
}


def markdown(res, cmdline):
    # Only the environments this run measured (--envs): one left out is not a failure.
    envs = [n for n in ENVS if any(n in r["envs"] for r in res["workloads"].values())] or ENVS
    pairs = [(a, b) for a, b in (("IMME", "CBE-mem"), ("IMME", "TME")) if a in envs and b in envs]
    s = [f"Reproduce: `{cmdline}` ({res['date']}, {res['reps']} runs each, median; "
         f"{int(res['outside'] * 100)}% of each footprint outside DRAM). Time normalized to IE "
         "(min-max of the runs); OOM-killed: the kernel killed the program in its cgroup; FAILED: a wrong result or a crash"
         + FAR_TEXT.get(res.get("far", "emulated"), "")
         + (f"; cut: stopped at {res['max_slowdown']:g}x the IE time" if res.get("max_slowdown") else "") + ".\n",
         ] + ([f"**Interrupted**: partial results, {len(res['workloads'])} of {res['selected']} workflows "
               "measured before the run was stopped.\n"] if res.get("interrupted") else []) + [
         "| workflow | flags | footprint | budget | " + " | ".join(envs) + " |"
         + "".join(f" {a} vs {b} |" for a, b in pairs),
         "|---|---|---|---|" + "---|" * (len(envs) + len(pairs))]
    for w, r in res["workloads"].items():
        e = r["envs"]
        cells = []
        for n in envs:
            x = e.get(n)
            why = failure(x)
            if why == "cut":
                cells.append(f"> {res['max_slowdown']:g} (cut)")
            elif why:
                cells.append(why)
            elif x["max"] > x["min"] and x["median"]:
                # The spread of the runs, normalized like the median.
                k = x["normalized"] / x["median"]
                cells.append(f"{x['normalized']:.2f} ({x['min'] * k:.2f}-{x['max'] * k:.2f})")
            else:
                cells.append(f"{x['normalized']:.2f}")

        def ratio(a, b):
            if e.get(a, {}).get("ok") and e.get(b, {}).get("ok"):
                return f"{e[b]['median'] / e[a]['median']:.2f}x"
            return "-"
        s.append(f"| {r['title']} | {r['flags']} | {r['footprint'] >> 20} MiB | {r['budget'] >> 20} MiB | "
                 + " | ".join(cells) + " |" + "".join(f" {ratio(a, b)} |" for a, b in pairs))
    missing = sorted({f"{n}: {x['setup_failed']}" for r in res["workloads"].values()
                      for n, x in r["envs"].items() if x.get("setup_failed")})
    if missing:
        s.append("\nn/a (set-up): the environment could not be set up (" + "; ".join(missing) + ").")
    roomless = [f"{w}: {r['envs'][n]['no_room']}" for w, r in res["workloads"].items()
                for n in envs if r["envs"].get(n, {}).get("no_room")]
    if roomless:
        s.append("\nno room: not run, the program's own memory outside Attune's regions leaves no "
                 "budget under the limit, and the kernel would kill it (" + "; ".join(dict.fromkeys(roomless)) + ").")
    if res.get("far", "emulated") != "emulated":
        # Every environment but IE in a cgroup at the budget: the peak each reached.
        cg = [n for n in envs if n != "IE"]
        s.append("\nPeak of the job's memory cgroup, MiB (limit: the budget):\n")
        s.append("| workflow | limit | " + " | ".join(cg) + " |")
        s.append("|---|---|" + "---|" * len(cg))
        for w, r in res["workloads"].items():
            pk = [r["envs"].get(n, {}).get("cgroup_peak") for n in cg]
            s.append(f"| {w} | {r['budget'] >> 20} | " + " | ".join("-" if not p else f"{p / 2**20:.1f}" for p in pk) + " |")
    s.append("\nFaults and pages moved (medians; Figure 9):\n")
    moved_envs = [n for n in envs if n != "IE"]
    s.append("| workflow | " + " | ".join(f"{n} major/minor/moved" for n in moved_envs) + " |")
    s.append("|---|" + "---|" * len(moved_envs))
    for w, r in res["workloads"].items():
        cells = []
        for n in moved_envs:
            x = r["envs"].get(n)
            cells.append("-" if not x else f"{int(x['majflt'])}/{int(x['minflt'])}/{int(x['moved_pages'])}")
        s.append(f"| {w} | " + " | ".join(cells) + " |")
    if res.get("sweep"):
        s.append("\nShare outside DRAM (Figure 6), time / IE:\n")
        s.append("| workflow | outside | TME | IMME | CBE-mem |\n|---|---|---|---|---|")
        for w, pts in res["sweep"].items():
            for p in pts:
                s.append(f"| {w} | {int(p['outside'] * 100)}% | {p.get('TME', float('nan')):.2f} | "
                         f"{p.get('IMME', float('nan')):.2f} | {p.get('CBE-mem', float('nan')):.2f} |")
    if res.get("chunks"):
        s.append("\nChunk size (rMap Figure 6), TME with `attune run --chunk`, time / IE:\n")
        s.append("| workflow | " + " | ".join(p["chunk"] for p in next(iter(res["chunks"].values()))) + " |")
        s.append("|---|" + "---|" * len(next(iter(res["chunks"].values()))))
        for w, pts in res["chunks"].items():
            s.append(f"| {w} | " + " | ".join(f"{p['normalized']:.2f}" for p in pts) + " |")
    return "\n".join(s) + "\n"


def stop_on_sigterm(signum, frame):
    """SIGTERM handler: stops the harness the way Ctrl-C does."""
    raise KeyboardInterrupt


def update_docs(name, heading, md):
    """Replaces the block between `<!-- name:begin -->` and `<!-- name:end -->` in
    docs/benchmarks.md with `md`, or appends it under `heading` the first time."""
    p = os.path.join(ROOT, "docs", "benchmarks.md")
    with open(p) as f:
        doc = f.read()
    b, e = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{b}\n{md}{e}"
    if b in doc:
        doc = doc[:doc.index(b)] + block + doc[doc.index(e) + len(e):]
    else:
        doc += f"\n## {heading}\n\n{block}\n"
    with open(p, "w") as f:
        f.write(doc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--outside", type=float, default=0.25)
    ap.add_argument("--only", help="comma-separated workload names")
    ap.add_argument("--sweep", action="store_true", help="Figure 6: 10%%-50%% outside DRAM (dm, stream, gups)")
    ap.add_argument("--chunks", action="store_true", help="rMap chunk sweep (stream, gups)")
    ap.add_argument("--quick", action="store_true", help="small sizes (tests)")
    ap.add_argument("--envs", default=",".join(ENVS))
    ap.add_argument("--far", choices=FARS, default="pool",
                    help="Attune's far memory: pool (attuned's, outside the job's cgroup; root), file (the "
                         "default far tier, in the cgroup's limit; root) or emulated (in the process, no cgroup)")
    ap.add_argument("--max-slowdown", type=float, default=0,
                    help="stop a run at this multiple of the workflow's IE time (0: never)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results"))
    ap.add_argument("--update-docs", action="store_true")
    ap.add_argument("--replot", metavar="JSON", help="only redraw the plots of a previous imme.json into --out")
    a = ap.parse_args()
    if a.replot:
        with open(a.replot) as f:
            old = json.load(f)
        os.makedirs(a.out, exist_ok=True)
        print("\n".join(plots(old, a.out, old.get("sweep"), old.get("chunks"))))
        return
    if not os.path.exists(ATT):
        sys.exit(f"{ATT} not found: run `make build` first")
    envs = [e for e in a.envs.split(",") if e]
    if any(e.startswith("CBE") for e in envs):
        # Not root, no cgroup v1, or a stuck swap device of an earlier run (the kernel's
        # swap would hang): `attune kernel-swap --check` says which.
        chk = subprocess.run([ATT, "kernel-swap", "--check"], capture_output=True, text=True)
        if chk.returncode != 0:
            print(f"CBE skipped: {chk.stdout.strip() or chk.stderr.strip()}", file=sys.stderr)
            envs = [e for e in envs if not e.startswith("CBE")]
    if not 0 < a.outside < 1:
        sys.exit("--outside must be between 0 and 1")
    far_kind = a.far
    if far_kind != "emulated" and any(e in ("TME", "IMME") for e in envs):
        # The job's cgroup needs root and cgroup v1 (the same check as CBE's), the pool attuned.
        chk = subprocess.run([ATT, "kernel-swap", "--check"], capture_output=True, text=True)
        if chk.returncode != 0 or (far_kind == "pool" and not os.path.exists(ATTUNED)):
            why = chk.stdout.strip() or chk.stderr.strip() or f"{ATTUNED} not found"
            print(f"--far {far_kind}: no cgroup for Attune's runs ({why}): --far emulated", file=sys.stderr)
            far_kind = "emulated"
    sel = [w for w in WORKLOADS if not a.only or w[0] in a.only.split(",")]
    if not sel:
        sys.exit(f"no workload matches {a.only}")
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="attune-imme-")
    exes = build(tmp)
    sweep_sel = [w for w in sel if w[0] in ("dm", "stream", "gups")] if a.sweep else []
    chunk_sel = [w for w in sel if w[0] in ("stream", "gups")] if a.chunks else []
    chunk_sizes = ["4K", "16K", "64K", "256K", "2M"]
    total = len(sel) * (2 + a.reps * len(envs)) + len(sweep_sel) * 4 * a.reps * 3 \
        + len(chunk_sel) * len(chunk_sizes) * a.reps
    bar = progress(total)
    far = Far(far_kind, tmp)
    res = {"date": time.strftime("%Y-%m-%d"), "reps": a.reps, "outside": a.outside, "max_slowdown": a.max_slowdown,
           "far": far_kind,
           "machine": {"cpus": os.cpu_count()}, "workloads": {}, "selected": len(sel)}
    failed = 0
    # SIGTERM (a batch system's time limit, a cancelled job) stops it like Ctrl-C: the run
    # in flight is stopped and what was measured is written, marked as partial.
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        for name, title, kind, src, sizes, flags in sel:
            size = sizes[1] if a.quick else sizes[0]
            prog = exes[name] + [str(size)]
            foot, managed_peak, ie_wall, outside_attune = footprint(prog, bar, name, far_kind != "emulated")
            limit = a.max_slowdown * max(ie_wall, 0.5) if a.max_slowdown > 0 else None
            unmanaged = foot - managed_peak
            budget = int(foot * (1 - a.outside))
            room = room_at(outside_attune, foot, budget)
            managed_budget = attune_budget(far_kind, budget, unmanaged, room)
            r = {"title": title, "flags": flags, "size_mib": size, "footprint": foot,
                 "unmanaged": unmanaged, "managed_peak": managed_peak, "held": outside_attune, "room": room, "budget": budget, "managed_budget": managed_budget, "envs": {}}
            for e in envs:
                r["envs"][e] = measure(e, prog, budget, managed_budget, flags, a.reps, bar, name, limit=limit,
                                       far=far, room=room, held=outside_attune)
                x = r["envs"][e]
                failed += not x["ok"] and not x["cut"] and not x.get("no_room") and e in ("IE", "TME", "IMME")
            ie = r["envs"].get("IE", {}).get("median")
            for e in r["envs"].values():
                e["normalized"] = e["median"] / ie if ie else float("nan")
            res["workloads"][name] = r
        if sweep_sel:
            res["sweep"] = {}
            for name, title, kind, src, sizes, flags in sweep_sel:
                r = res["workloads"][name]
                prog = exes[name] + [str(r["size_mib"])]
                ie = r["envs"]["IE"]["median"]
                pts = []
                for out in (0.1, 0.2, 0.3, 0.4, 0.5):
                    budget = int(r["footprint"] * (1 - out))
                    room = room_at(r["held"], r["footprint"], budget)
                    mbud = attune_budget(far_kind, budget, r["unmanaged"], room)
                    p = {"outside": out}
                    for e in ("TME", "IMME", "CBE-mem"):
                        if e in envs:
                            m = measure(e, prog, budget, mbud, flags, a.reps, bar, f"{name} {int(out * 100)}%",
                                        far=far, room=room, held=r["held"])
                            p[e] = m["median"] / ie if m["ok"] else float("nan")
                    pts.append(p)
                res["sweep"][name] = pts
        if chunk_sel:
            res["chunks"] = {}
            for name, title, kind, src, sizes, flags in chunk_sel:
                r = res["workloads"][name]
                prog = exes[name] + [str(r["size_mib"])]
                ie = r["envs"]["IE"]["median"]
                pts = []
                for c in chunk_sizes:
                    # TME: in attuned mode a LAT region always moves 4 KiB (policy), which
                    # would hide the chunk size being swept.
                    m = measure("TME", prog, r["budget"], r["managed_budget"], flags, a.reps, bar, f"{name} {c}", chunk=c,
                                far=far, room=r["room"], held=r["held"])
                    pts.append({"chunk": c, "normalized": m["median"] / ie if m["ok"] else float("nan")})
                res["chunks"][name] = pts
    except KeyboardInterrupt:
        res["interrupted"] = True
        print(f"\ninterrupted: writing the partial results ({len(res['workloads'])} of {len(sel)} workflows)",
              file=sys.stderr)
    finally:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
    with open(os.path.join(a.out, "imme.json"), "w") as f:
        json.dump(res, f, indent=1)
    cmdline = "python3 bench/imme.py " + " ".join(sys.argv[1:])
    md = markdown(res, cmdline.strip())
    with open(os.path.join(a.out, "imme.md"), "w") as f:
        f.write(md)
    made = plots(res, a.out, res.get("sweep"), res.get("chunks"))
    print(md)
    print(f"wrote {a.out}/imme.json, {a.out}/imme.md" + ("".join(f", {os.path.basename(m)}" for m in made)))
    if a.update_docs and res.get("interrupted"):
        print("docs/benchmarks.md not updated: the run was interrupted", file=sys.stderr)
    elif a.update_docs:
        update_docs("imme", "IMME's evaluation on this machine (`bench/imme.py`)", md)
    for w, r in res["workloads"].items():
        for e, x in r["envs"].items():
            if not x["ok"]:
                print(f"{w} {e}: {failure(x)} {x['result']} {''.join(x['errors'])[-400:]}", file=sys.stderr)
    sys.exit(130 if res.get("interrupted") else 1 if failed else 0)


if __name__ == "__main__":
    main()
