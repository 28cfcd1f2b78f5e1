"""The node's far pool in attuned, for real (docs/design/pool.md): runtimes with a `pool`
tier store what leaves DRAM in a segment the daemon allocates, so it is charged to the
daemon's memory cgroup and not to the job's. Co-located jobs in their own cgroups stay
within their limits (the in-process memory tier only by spilling to a file), every word verifies; a dead
runtime's segment is released; a daemon restart keeps the data; a forked child keeps
its copy; forged segments are refused.

Needs the staged build (make build)."""
import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from test_daemon import (ATTUNED, BUILD, MIB, ROOT, as_nobody, client, connect, daemon,  # noqa: F401
                         finish, frame, recv_frame, workdir)

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


def pool_config(workdir, capacity="512M"):
    p = workdir / f"pool-{capacity}.toml"
    p.write_text(f"""
[[tier]]
name = "pool"
kind = "pool"
capacity = "{capacity}"

[[tier]]
name = "file"
kind = "file"
path = "{workdir}"
capacity = "1G"
direct = true
""")
    return p


def build(workdir, name):
    out = workdir / name
    if not out.exists():
        subprocess.run(["gcc", "-O2", f"-I{BUILD}/include", f"-I{ROOT}/tests/c", str(ROOT / f"tests/c/{name}.c"),
                        "-o", str(out), f"-L{BUILD}/lib", "-lattune", f"-Wl,-rpath,{BUILD}/lib", "-lpthread"],
                       check=True)
    return out


def workflow_of(st, pid):
    for w in st["workflows"]:
        if pid in w["pids"]:
            return w
    return None


def pool_fds(pid):
    d = Path(f"/proc/{pid}/fd")
    n = 0
    for f in d.iterdir():
        try:
            n += os.readlink(f).startswith("/memfd:attune-pool:")
        except OSError:
            pass
    return n


class Cgroup:
    """A cgroup v1 memory group of this test, with a limit; removed at the end."""

    def __init__(self, name, limit):
        self.path = CGROUP_ROOT / f"attune-pooltest-{os.getpid()}-{name}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit))

    def wrap(self, argv):
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *map(str, argv)]

    def peak(self):
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def oom_kills(self):
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def remove(self):
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


needs_cgroup = pytest.mark.skipif(
    os.geteuid() != 0 or not (CGROUP_ROOT / "memory.limit_in_bytes").exists(),
    reason="needs root and the cgroup v1 memory controller")


@needs_cgroup
def test_colocated_jobs_stay_within_their_cgroups_with_the_pool(workdir, daemon):
    """Three jobs of 160 MiB each on 24 MiB of DRAM, each in a cgroup of 96 MiB: with the
    pool tier they finish, verified, within their limits, while the daemon holds their
    far pages; with the in-process memory tier the runtime must hold that tier under the
    limit and spill to a file."""
    d = daemon("--dram", "128M", "--far-pool", "640M", "--move-limit", "off")
    cfg = pool_config(workdir)
    groups = [Cgroup(f"job{i}", 96 * MIB) for i in range(3)]
    control = Cgroup("control", 96 * MIB)
    try:
        jobs = [subprocess.Popen(g.wrap([workdir / "client", "workflow", "CAP", 160, 5]),
                                 env=d.env(ATTUNE_CONFIG=cfg, ATTUNE_DRAM="24M"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for g in groups]
        held = 0
        while any(j.poll() is None for j in jobs):
            st = d.status()
            held = max(held, st["pool_bytes"])
            assert st["pool_bytes"] <= 640 * MIB, st
            time.sleep(0.2)
        for j, g in zip(jobs, groups):
            out, err = j.communicate()
            assert j.returncode == 0 and "workflow: OK" in out, out + err
            assert g.peak() < 96 * MIB, f"{g.path.name}: peak {g.peak() >> 20} MiB"
        # 3 x (160 - 24) MiB left DRAM; nearly all of it was in the daemon's segments.
        assert held >= 300 * MIB, held
        # The same job with the in-process emulation of far memory: its pages count against
        # the job's limit, so the runtime holds that tier to what the limit leaves (64 MiB
        # less the budget) and the file tier takes the rest (tests/python/test_cgroup_limit.py).
        # Before that rule the job was killed at its limit.
        p = subprocess.run(control.wrap([workdir / "client", "workflow", "CAP", 160, 5]),
                           env=dict(os.environ, ATTUNE_DAEMON="off", ATTUNE_DRAM="24M", ATTUNE_FAR="memory,file"),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and "workflow: OK" in p.stdout, p
        assert f"far tier 'memory' holds at most {40 * MIB} bytes" in p.stderr, p.stderr
        # (Its cgroup reaches the limit with the file tier's page cache, which the kernel
        # reclaims: no process is killed.)
        assert control.oom_kills() == 0, control.peak()
    finally:
        for g in groups + [control]:
            g.remove()
    time.sleep(0.3)
    assert d.status()["pool_bytes"] == 0


@pytest.mark.parametrize("chunk", ["4K", "64K", "2M"])
def test_integrity_through_the_pool(workdir, daemon, chunk):
    d = daemon("--dram", "128M", "--far-pool", "256M", "--move-limit", "off")
    p = subprocess.run([build(workdir, "integrity"), "48"], capture_output=True, text=True, timeout=300,
                       env=d.env(ATTUNE_CONFIG=pool_config(workdir), ATTUNE_DRAM="16M",
                                 TEST_BUDGET=16 * MIB, ATTUNE_CHUNK_SIZE=chunk, ATTUNE_LOG="info"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "segment of the node's far pool attached" in p.stderr, p.stderr


def test_stress_discard_and_signal_delivery_through_the_pool(workdir, daemon):
    d = daemon("--dram", "128M", "--far-pool", "256M", "--move-limit", "off")
    env = d.env(ATTUNE_CONFIG=pool_config(workdir), ATTUNE_DRAM="16M", TEST_BUDGET=16 * MIB)
    p = subprocess.run([build(workdir, "stress"), "64"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    # Pages the program discards (MADV_DONTNEED, attune_discard) inside far chunks.
    p = subprocess.run([build(workdir, "discard")], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    env["ATTUNE_FAULT_MODE"] = "signal"
    p = subprocess.run([build(workdir, "integrity"), "48"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("mode", ["thread", "signal"])
def test_read_ahead_from_the_pool_copies_short_runs(workdir, daemon, mode):
    """The pool copies runs into place: tests/c/readahead.c's patterns verify every value,
    and no fault of its forward pass fetches more than 256 KiB (tier::COPIED_RUN)."""
    d = daemon("--dram", "256M", "--far-pool", "256M", "--move-limit", "off")
    p = subprocess.run([build(workdir, "readahead"), "copied"], capture_output=True, text=True, timeout=300,
                       env=d.env(ATTUNE_CONFIG=pool_config(workdir), ATTUNE_DRAM="16M", ATTUNE_FAULT_MODE=mode,
                                 ATTUNE_LOG="info"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "segment of the node's far pool attached" in p.stderr, p.stderr


def test_a_forked_child_keeps_its_copy(workdir, daemon):
    d = daemon("--dram", "128M", "--far-pool", "256M", "--move-limit", "off")
    p = subprocess.run([build(workdir, "fork_inherit")], capture_output=True, text=True, timeout=300,
                       env=d.env(ATTUNE_CONFIG=pool_config(workdir), ATTUNE_DRAM="16M", TEST_BUDGET=16 * MIB))
    assert p.returncode == 0 and "fork_inherit: ok" in p.stdout, p.stdout + p.stderr
    assert "segment already" not in p.stderr, p.stderr


def test_a_dead_runtimes_segment_is_released(workdir, daemon):
    port = random.randrange(20000, 40000)
    d = daemon("--dram", "128M", "--far-pool", "256M", "--move-limit", "off", metrics=f"127.0.0.1:{port}")
    c = client(workdir, d, "workflow", "CAP", 96, 30, ATTUNE_CONFIG=pool_config(workdir), ATTUNE_DRAM="24M")
    # By time, not by a count of polls: each poll starts `attune status`, slow on a busy
    # CI machine (a 100-poll loop once ended after 10 s, just before the pool filled).
    deadline = time.time() + 30
    while True:
        st = d.status()
        w = workflow_of(st, c.pid)
        if w and w["pool"] >= 32 * MIB and dict(w["tiers"]).get("pool", 0) >= 32 * MIB:
            break
        assert time.time() < deadline and c.poll() is None, f"the pool never held the workflow's pages: {st}"
        time.sleep(0.1)
    assert pool_fds(d.proc.pid) == 1
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    held = [float(l.split()[-1]) for l in metrics.splitlines() if l.startswith("attune_pool_bytes ")]
    assert held and held[0] >= 32 * MIB, metrics
    assert "attune_workflow_pool_bytes{" in metrics, metrics
    c.kill()
    c.wait()
    time.sleep(0.3)
    st = d.status()
    assert st["pool_bytes"] == 0 and st["workflows"] == [], st
    assert pool_fds(d.proc.pid) == 0, "the daemon still holds the dead runtime's segment"


def test_the_data_survives_a_daemon_restart(workdir, daemon):
    """The runtime keeps its mapping while the daemon is gone and hands the segment back
    to the new daemon, which adopts it: every word verifies at the end."""
    d = daemon("--dram", "128M", "--far-pool", "256M", "--move-limit", "off")
    c = client(workdir, d, "workflow", "CAP", 96, 6, ATTUNE_CONFIG=pool_config(workdir), ATTUNE_DRAM="24M")
    deadline = time.time() + 30
    while time.time() < deadline:
        w = workflow_of(d.status(), c.pid)
        if w and dict(w["tiers"]).get("pool", 0) >= 32 * MIB:
            break
        time.sleep(0.1)
    d.kill()
    time.sleep(0.7)
    d.start()
    deadline = time.time() + 20
    while True:
        st = d.status()
        w = workflow_of(st, c.pid)
        if w and w["pool"] > 0:
            break
        assert time.time() < deadline, f"segment not re-adopted: {st}"
        time.sleep(0.1)
    assert "pool segment re-adopted" in d.log.read_text()
    rc, out = finish(c)
    assert rc == 0 and "workflow: OK" in out, out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
def test_a_user_who_is_not_root_gets_a_segment(workdir, daemon):
    d = daemon("--dram", "128M", "--far-pool", "256M", "--move-limit", "off")
    os.chmod(pool_config(workdir), 0o644)
    c = subprocess.Popen([str(workdir / "client"), "workflow", "CAP", "64", "3"],
                         env=d.env(ATTUNE_CONFIG=pool_config(workdir), ATTUNE_DRAM="16M"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_nobody)
    seen = 0
    while c.poll() is None:
        w = workflow_of(d.status(), c.pid)
        if w:
            assert w["uid"] == 65534
            seen = max(seen, dict(w["tiers"]).get("pool", 0))
        time.sleep(0.1)
    out, err = c.communicate()
    assert c.returncode == 0 and "workflow: OK" in out, out + err
    assert seen >= 16 * MIB, seen


def test_without_a_far_pool_the_next_tier_serves(workdir, daemon):
    d = daemon("--dram", "128M", "--far-pool", "off")
    rc, out = finish(client(workdir, d, "workflow", "CAP", 64, 2, ATTUNE_CONFIG=pool_config(workdir),
                            ATTUNE_DRAM="16M"))
    assert rc == 0 and "workflow: OK" in out, out
    assert "gives this process no segment" in out, out


def hello_with(d, fd, want_pool=True):
    s = connect(d)
    body = frame({"op": "hello", "version": 1, "workflow": "forger", "flags": "CAP", "want": 64 * MIB,
                  "protected": 0, "pool": want_pool, "pool_held": True, "fds": 1})
    socket.send_fds(s, [body[:1]], [fd])
    s.sendall(body[1:])
    while True:
        r = recv_frame(s)
        if r is None or r["op"] != "grant":
            return s, r


def test_forged_segments_are_not_adopted(workdir, daemon):
    """A re-registered segment is a claim on the far pool: a descriptor that is not a
    memory file, or one larger than what is left of the pool, is refused (and counted),
    and the client is welcomed without a segment."""
    d = daemon("--dram", "128M", "--far-pool", "64M")
    with open("/proc/self/stat") as f:
        s, r = hello_with(d, f.fileno())
    assert r["op"] == "welcome" and "pool" not in r, r
    s.close()
    big = os.memfd_create("attune-pool:forged")
    os.ftruncate(big, 256 * MIB)
    s, r = hello_with(d, big)
    assert r["op"] == "welcome" and "pool" not in r, r
    assert d.status()["pool_bytes"] == 0
    s.close()
    # Announcing a held segment without asking for a pool tier is malformed.
    s, r = hello_with(d, big, want_pool=False)
    assert r["op"] == "error", r
    os.close(big)
    log = d.log.read_text()
    assert "not a memory file" in log and "bytes left of far_pool" in log, log
    assert d.status()["rejected"] >= 3


def build_plain(workdir, name, *flags):
    """A test program of tests/run (no Attune API), for `attune run`."""
    out = workdir / name
    if not out.exists():
        subprocess.run(["gcc", "-O2", *flags, str(ROOT / f"tests/run/{name}.c"), "-o", str(out)], check=True)
    return out


ATTUNE = BUILD / "bin" / "attune"


@needs_cgroup
def test_attune_run_of_an_unmodified_program_within_its_cgroup(workdir, daemon):
    """`attune run` of a plain C program of 128 MiB on 32 MiB of DRAM, in a cgroup of
    80 MiB: every buffer verifies, the cgroup's peak stays below the limit, the run
    report names the pool tier. A fork+exec'd child gets a segment of its own."""
    d = daemon("--dram", "256M", "--far-pool", "512M", "--move-limit", "off")
    cfg = pool_config(workdir)
    g = Cgroup("run", 80 * MIB)
    try:
        rep = workdir / "run.json"
        p = subprocess.run(g.wrap([ATTUNE, "run", "--dram", "32M", "--config", cfg, "--report", rep, "--",
                                   build_plain(workdir, "c_matrix"), "128"]),
                           env=d.env(), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0 and "c_matrix: OK" in p.stdout, p.stdout + p.stderr
        assert g.peak() < 80 * MIB, f"peak {g.peak() >> 20} MiB"
        report = rep.read_text()
        assert '"pool"' in report, report
    finally:
        g.remove()
    c = build_plain(workdir, "c_matrix")
    p = subprocess.run([ATTUNE, "run", "--dram", "32M", "--config", cfg, "--",
                        build_plain(workdir, "fork_exec"), "48", c, "32"],
                       env=d.env(ATTUNE_LOG="info"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "c_matrix: OK" in p.stdout, p.stdout + p.stderr
    assert p.stderr.count("segment of the node's far pool attached") >= 2, p.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
def test_attune_run_system_calls_into_pool_pages_as_nobody(workdir, daemon):
    """read(2), write(2) and friends into buffers whose pages are in the pool, for a user
    who is not root (user-mode-only userfaultfd: the interposer retries what the kernel
    cannot fault in)."""
    d = daemon("--dram", "256M", "--far-pool", "512M", "--move-limit", "off")
    cfg = pool_config(workdir)
    os.chmod(cfg, 0o644)
    io = build_plain(workdir, "syscalls_io", "-Wno-stringop-overflow", "-lpthread")
    scratch = workdir / "io-scratch"
    scratch.mkdir(exist_ok=True)
    os.chmod(scratch, 0o777)
    p = subprocess.run([ATTUNE, "run", "--dram", "16M", "--config", cfg, "--", io, scratch, "64"],
                       env=d.env(ATTUNE_LOG="info"), capture_output=True, text=True, timeout=300,
                       preexec_fn=as_nobody)
    assert p.returncode == 0 and "syscalls_io: OK" in p.stdout, p.stdout + p.stderr
    assert "segment of the node's far pool attached" in p.stderr, p.stderr


@needs_cgroup
def test_a_daemon_killed_by_its_cgroup_while_growing_loses_no_data(workdir, daemon):
    """attuned in a memory cgroup of 64 MiB with a far pool of 256 MiB. In a memory
    cgroup `fallocate` does not fail: the kernel's OOM killer kills the daemon as the
    segment grows past the limit (found writing this test; docs/design/pool.md). The
    runtime keeps its mapping and its data, runs on alone, and every word verifies."""
    g = Cgroup("daemon", 64 * MIB)
    try:
        d = daemon("--dram", "128M", "--far-pool", "256M", "--move-limit", "off",
                   wrap=["sh", "-c", f'echo $$ > {g.path}/cgroup.procs && exec "$@"', "sh"])
        rc, out = finish(client(workdir, d, "workflow", "CAP", 160, 4, ATTUNE_CONFIG=pool_config(workdir),
                                ATTUNE_DRAM="16M"), timeout=120)
        assert rc == 0 and "workflow: OK" in out, out
        assert d.proc.wait(timeout=10) == -signal.SIGKILL, "the daemon outlived its limit"
        assert "lost attuned" in out, out
    finally:
        g.remove()


@needs_cgroup
def test_a_claim_is_bounded_by_the_claimants_memory_cgroup(workdir, daemon):
    """A client of user nobody in a cgroup of 64 MiB claims 1 TiB: the daemon counts at most 64 MiB for it
    (its process cannot keep more), read from the kernel's cgroup, not from the client.
    The same claim from outside any limit counts the daemon's whole DRAM."""
    from test_daemon import NOBODY_PRELUDE
    d = daemon("--dram", "512M")
    prog = NOBODY_PRELUDE + f"s = connect({d.sock!r})\nhello(s, sys.argv[1], want=1 << 40)\n" \
        "print('ready', flush=True)\nsys.stdin.read()\n"
    g = Cgroup("claim", 64 * MIB)
    procs = []
    try:
        # As nobody, as an HPC user claims (root joins the cgroup, then becomes nobody).
        nobody = ["runuser", "-u", "nobody", "--", "python3", "-c", prog]
        for name, argv in (("capped", g.wrap([*nobody, "capped"])), ("free", [*nobody, "free"])):
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            procs.append(p)
            assert p.stdout.readline().strip() == "ready"
        want = {w["name"]: w["want"] for w in d.status()["workflows"]}
        assert want == {"capped": 64 * MIB, "free": 512 * MIB}, want
    finally:
        for p in procs:
            p.stdin.close()
            p.wait()
        g.remove()


# A runtime of the protocol's own: registers with a board, claiming `argv[2]` bytes, and
# writes 8 MiB in its slot. For each line on its standard input it reports (the same
# claim, and the boards it took), takes what the daemon pushed (a new board after a
# move), and prints how many runtimes its board counts, the sum of the others' slots and
# how many boards it was given after its welcome.
BOARD_CLIENT = """
import mmap, os
def recv_fds_frame(s):
    hdr, fds, _, _ = socket.recv_fds(s, 4, 4)
    if not hdr:
        raise EOFError
    while len(hdr) < 4:
        hdr += s.recv(4 - len(hdr))
    n = struct.unpack("<I", hdr)[0]
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return json.loads(body), fds
want = int(sys.argv[2])
s = connect(SOCK)
s.sendall(frame({"op": "hello", "version": 1, "workflow": sys.argv[1], "flags": "CAP",
                 "want": want, "protected": 0, "board": True}))
while True:
    r, fds = recv_fds_frame(s)
    if r["op"] == "welcome":
        break
def attach(slot, fd):
    words = mmap.mmap(fd, 4096 * 8)
    struct.pack_into("<Q", words, slot * 8, 8 * MIB)
    return words
slot, boards = r["board"], 0
words = attach(slot, fds[-1])
print(json.dumps({"pid": os.getpid(), "slot": slot}), flush=True)
for line in sys.stdin:
    u = {"op": "usage", "resident": 8 * MIB, "pinned": 0, "protected": 0, "want": want, "faults": 0,
         "evictions": 0, "fetched_bytes": 0, "evicted_bytes": 0, "sample_parks": 0, "sample_hits": 0, "ack": 0}
    s.sendall(frame(dict(u, boards=boards) if boards else u))
    s.settimeout(0.2)
    try:
        while True:
            r, fds = recv_fds_frame(s)
            if r["op"] == "board":
                boards += 1
                struct.pack_into("<Q", words, slot * 8, 0)
                slot, words = r.get("board"), (attach(r["board"], fds[0]) if r.get("board") else None)
    except (socket.timeout, BlockingIOError):
        pass
    s.settimeout(10)
    w = struct.unpack_from("<4096Q", words) if words else [0]
    print(json.dumps({"count": w[0], "peers": sum(w[1:]) - (w[slot] if words else 0),
                      "boards": boards}), flush=True)
"""

MOVER = """
import sys, time
buf = bytearray(160 << 20)  # more than the first group's limit
for i in range(0, len(buf), 4096):
    buf[i] = (i >> 12) & 255
print("ready", flush=True)
sys.stdin.readline()  # moved to another group
time.sleep(4)
bad = sum(1 for i in range(0, len(buf), 4096) if buf[i] != (i >> 12) & 255)
print("mover: bad", bad, flush=True)
"""


@needs_cgroup
def test_a_runtime_moved_to_another_cgroup_is_counted_in_the_new_one(workdir, daemon):
    """`attune run` of a program of 160 MiB in a job's cgroup of 128 MiB, beside another
    runtime there, is moved to a group of 512 MiB (a Slurm step, an administrator's
    `cgclassify`). The daemon reads the process's cgroup again at its reports, once a
    second: its claim is capped by the new limit, not the old, it leaves the old group's board (whose runtime then counts
    no peer) and gets the new group's (whose runtime counts it). Before, the daemon read
    the group once, at connection: the old group's runtime kept counting the mover's
    pages as its peers' and the new group's never saw them. All as nobody."""
    from test_daemon import NOBODY_PRELUDE
    d = daemon("--dram", "1G", "--move-limit", "off")
    g1, g2 = Cgroup("from", 128 * MIB), Cgroup("to", 512 * MIB)
    procs = []

    def board_client(g, name, want=64 * MIB):
        prog = NOBODY_PRELUDE + f"SOCK = {d.sock!r}\n" + BOARD_CLIENT
        p = subprocess.Popen(g.wrap(["runuser", "-u", "nobody", "--", "python3", "-c", prog, name, str(want)]),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        p.first = p.stdout.readline()
        assert p.first, p.communicate(timeout=10)
        return p

    def show(p):
        p.stdin.write("\n")
        p.stdin.flush()
        return json.loads(p.stdout.readline())

    def want_of(name):
        return {w["name"]: w["want"] for w in d.status()["workflows"]}.get(name)

    try:
        stay, other = board_client(g1, "stay"), board_client(g2, "other")
        before = set((g1.path / "cgroup.procs").read_text().split())
        prog = workdir / "mover.py"
        prog.write_text(MOVER)
        os.chmod(workdir, 0o755)
        os.chmod(prog, 0o644)
        mover = subprocess.Popen(g1.wrap(["runuser", "-u", "nobody", "--", ATTUNE, "run", "--dram", "1G", "--",
                                          "python3", prog]),
                                 env=d.env(ATTUNE_WORKFLOW="mover", ATTUNE_LOG="info", ATTUNE_FAR="file",
                                           ATTUNE_TIER_FILE_DIRECT="true"), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(mover)
        assert mover.stdout.readline().strip() == "ready", mover.communicate(timeout=30)
        deadline = time.time() + 10
        while not (show(stay)["count"] == 2 and show(stay)["peers"] >= 32 * MIB) and time.time() < deadline:
            time.sleep(0.1)
        seen = show(stay)
        assert seen["count"] == 2 and seen["peers"] >= 32 * MIB and seen["boards"] == 0, seen
        assert show(other) == {"count": 1, "peers": 0, "boards": 0}
        for pid in set((g1.path / "cgroup.procs").read_text().split()) - before:
            (g2.path / "cgroup.procs").write_text(pid)
        mover.stdin.write("go\n")
        mover.stdin.flush()
        deadline = time.time() + 10
        while time.time() < deadline:
            s, o = show(stay), show(other)
            if s["count"] == 1 and s["peers"] == 0 and o["count"] == 2 and o["peers"] >= 32 * MIB:
                break
            time.sleep(0.2)
        assert s["count"] == 1 and s["peers"] == 0, s
        assert o["count"] == 2 and o["peers"] >= 32 * MIB, o
        out, err = mover.communicate(timeout=60)
        assert mover.returncode == 0 and "mover: bad 0" in out, out + err
        assert "memory cgroup changed: slot" in err, err
        # A claim of 1 TiB counts at most its group's limit, the group it is in now.
        claimer = board_client(g1, "claimer", want=1 << 40)
        assert want_of("claimer") == 128 * MIB
        assert show(stay)["count"] == 2
        (g2.path / "cgroup.procs").write_text(str(json.loads(claimer.first)["pid"]))
        deadline = time.time() + 10
        while time.time() < deadline:
            c = show(claimer)
            if c["boards"] == 1 and want_of("claimer") == 512 * MIB:
                break
            time.sleep(0.2)
        assert want_of("claimer") == 512 * MIB
        # It reads the new group's board (the other client and itself), and its report on
        # it freed its old slot: the first group counts its one runtime again.
        assert c == {"count": 2, "peers": 8 * MIB, "boards": 1}, c
        assert show(stay) == {"count": 1, "peers": 0, "boards": 0}
    finally:
        for p in procs:
            if p.poll() is None:
                p.stdin.close()
                p.kill()
                p.wait()
        g1.remove()
        g2.remove()


def fill_together(workdir, d, user, n, mib, tag):
    """`n` `attune run` programs filling `mib` MiB each (`rand_update`), started at once in
    one job's cgroup of 256 MiB (as `user`, None: root; the cgroup is joined as root, then
    `runuser`), with the pool-then-file config. Asserts each verified, no process was
    killed and the group stayed under its limit; returns their run reports."""
    prog = build_plain(workdir, "rand_update")
    g = Cgroup(f"{tag}-{user}", 256 * MIB)
    # Reports and the file tier (which takes what the pool segments do not yet) in a
    # directory the user may write.
    out = workdir / f"{tag}-{user}"
    out.mkdir(exist_ok=True)
    os.chmod(out, 0o777)
    cfg = pool_config(out)
    os.chmod(cfg, 0o644)
    reps = [out / f"{i}.json" for i in range(n)]
    who = ["runuser", "-u", user, "--"] if user else []
    try:
        jobs = [subprocess.Popen(g.wrap([*who, ATTUNE, "run", "--dram", "512M", "--config", cfg, "--report", rep,
                                         "--", prog, str(mib), "400000"]),
                                 env=d.env(ATTUNE_WORKFLOW=f"{tag}{i}"), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
                for i, rep in enumerate(reps)]
        for j in jobs:
            o, err = j.communicate(timeout=300)
            assert j.returncode == 0 and "rand_update: OK" in o, (g.oom_kills(), o + err)
        assert g.oom_kills() == 0
        assert g.peak() <= 256 * MIB, g.peak()
        print(f"{n} x {mib} MiB as {user or 'root'}: group peak {g.peak() / MIB:.0f} MiB")
    finally:
        g.remove()
    return [json.loads(r.read_text())["per_process"][0] for r in reps]


@needs_cgroup
@pytest.mark.parametrize("user", [None, "nobody"])
def test_runtimes_in_one_cgroup_do_not_count_each_other_as_outside(workdir, daemon, user):
    """Three `attune run` programs in one job's cgroup of 256 MiB, on a daemon whose DRAM
    (512 MiB) is wider than the group, so the runtimes' `follow_limit` must keep the
    group under its limit. The daemon tells each what the others hold resident
    (`Reply::Peers`): those pages are not "outside" (before, each runtime read the other
    two's pages as its program's own growth, 150-200 MiB here, and gave back the whole
    excess itself; in `bench/fig7.py --policies pool` a LAT workflow's budget fell to a
    fifth of its grant). Every program verifies, no process is killed, the group stays
    under its limit, and what each saw outside is about its own program's memory. Also as nobody."""
    d = daemon("--dram", "512M", "--far-pool", "1G", "--move-limit", "off")
    procs = fill_together(workdir, d, user, 3, 120, "peers")
    for p in procs:
        assert p["cgroup_limit_bytes"] == 256 * MIB, p
        # The program's own memory beyond its managed pages (its text, libc, the
        # runtime's tables: a few MiB), and what the other two faulted in since the
        # daemon last told (a report within 20 ms of 4 MiB moved; 15-48 MiB seen). The
        # other two runtimes' pages counted whole read 131-224 MiB on the build before.
        assert p["cgroup_outside_peak_bytes"] < 96 * MIB, p
    # The group's DRAM went to the three (each verified above), not to a margin nobody
    # uses: what they held at their peaks adds up to most of the limit.
    assert sum(p["peak_resident_bytes"] for p in procs) > 160 * MIB, procs


@needs_cgroup
@pytest.mark.parametrize("user", [None, "nobody"])
def test_eight_runtimes_filling_one_cgroup_at_once_are_not_killed(workdir, daemon, user):
    """Eight programs of 80 MiB each (640 MiB) start at once in one cgroup of 256 MiB, on a
    daemon whose grants (64 MiB each) add up to twice the group. Each runtime reads the
    group before its first fault, not at its evictor's first tick 50 ms later, and
    divides the free room below the limit by the number of runtimes the daemon says
    share it (`Reply::Peers`). Before, 18 of 40 processes were killed in 5 runs of 5 as
    root, in 2 runs of 3 as nobody (docs/design/paging.md, "Several runtimes in one
    group"). Every program verifies, no process is killed, and the group stays under its
    limit."""
    d = daemon("--dram", "512M", "--far-pool", "2G", "--move-limit", "off")
    procs = fill_together(workdir, d, user, 8, 80, "eight")
    assert all(p["cgroup_limit_bytes"] == 256 * MIB for p in procs), procs
    # The shares are not starvation: each held a good part of its array at its peak.
    assert all(p["peak_resident_bytes"] >= 16 * MIB for p in procs), procs


def pool_only_config(workdir):
    """A `pool` tier and nothing after it: what leaves DRAM has nowhere else to go."""
    p = workdir / "pool-only.toml"
    p.write_text('[[tier]]\nname = "pool"\nkind = "pool"\ncapacity = "2G"\n')
    os.chmod(p, 0o644)
    return p


@needs_cgroup
@pytest.mark.parametrize("user", [None, "nobody"])
def test_a_fast_fill_waits_for_its_segment_to_grow(workdir, daemon, user):
    """`attune run` of a program that fills 512 MiB at once, in a cgroup of 128 MiB, with
    the pool tier alone. Its first far grant is a few MiB and the fill outruns the first
    report: before, every fault found the pool full, placed its page over the budget,
    and the kernel killed the job 70 ms after start. Now a fault with no room waits for
    the daemon to grow the segment (`paging::room`). Then a Python program filling
    870 MiB of small objects under `--small` in 256 MiB: its far want reaches ahead by
    its growth rate, so few faults wait (364 with 4 MiB ahead). Both verify, without an
    OOM kill, under the limit. The C program also as nobody (without privileged
    userfaultfd `--small` leaves CPython's heap untiered: docs/design/run.md)."""
    d = daemon("--dram", "512M", "--far-pool", "2G", "--move-limit", "off")
    out = workdir / f"fill-{user}"
    out.mkdir(exist_ok=True)
    os.chmod(out, 0o777)
    cfg = pool_only_config(out)
    py = out / "pyfill.py"
    py.write_text("import sys\nn = int(sys.argv[1])\n"
                  "a = [bytes([i % 251]) * 1000 + str(i).encode() for i in range(n)]\n"
                  "b = [bytes([i % 251]) * 1000 + str(i).encode() for i in range(n)]\n"
                  "assert a == b\nprint('pyfill: OK', len(a))\n")
    os.chmod(py, 0o644)
    who = ["runuser", "-u", user, "--"] if user else []
    runs = [("c", 128, [], [build_plain(workdir, "rand_update"), "512", "100000"], "rand_update: OK"),
            ("py", 256, ["--small"], ["/usr/bin/python3", py, "400000"], "pyfill: OK")][:2 if user is None else 1]
    for name, limit, flags, argv, ok in runs:
        g = Cgroup(f"fill-{name}-{user}", limit * MIB)
        rep = out / f"{name}.json"
        try:
            p = subprocess.run(g.wrap([*who, ATTUNE, "run", "--dram", "512M", *flags, "--config", cfg,
                                       "--report", rep, "--", *argv]),
                               env=d.env(), capture_output=True, text=True, timeout=300)
            assert p.returncode == 0 and ok in p.stdout, f"{name}: {p.returncode}\n{p.stdout}{p.stderr}"
            g_peak = g.peak()
            assert g.oom_kills() == 0 and g_peak <= limit * MIB, (name, g_peak)
        finally:
            g.remove()
        report = json.loads(rep.read_text())
        proc = max(report["per_process"], key=lambda q: q["peak_resident_bytes"])
        # The figures of docs/design/pool.md ("When the segment is full"), with -s.
        print(f"{name} as {user or 'root'}: peak {g_peak >> 20} of {limit} MiB, {proc['room_waits']} wait(s), "
              f"{proc['room_wait_ns'] / 1e6:.0f} ms waited, {report['wall_seconds']:.2f} s")
        assert proc["room_waits"] >= 1, proc
        if name == "py":
            assert proc["room_waits"] < 50, proc


def pool_only_run(workdir, user, tag, prog, *args):
    """`attune run --dram 32M` of tests/run's `prog` with the pool tier alone, as `user`
    (None: root), its report in a directory the user may write: (command, report)."""
    if user and os.geteuid() != 0:
        pytest.skip("needs root to run a program as another user")
    out = workdir / f"{tag}-{user}"
    out.mkdir(exist_ok=True)
    os.chmod(out, 0o777)
    rep = out / f"{tag}.json"
    who = ["runuser", "-u", user, "--"] if user else []
    return [*who, ATTUNE, "run", "--dram", "32M", "--config", pool_only_config(out), "--report", rep,
            "--", build_plain(workdir, prog), *args], rep


@pytest.mark.parametrize("user", [None, "nobody"])
def test_a_full_pool_costs_one_wait_then_goes_over_the_budget(workdir, daemon, user):
    """The node's pool (32 MiB) is smaller than what leaves DRAM (a program of 256 MiB
    on 32 MiB): no grant can make room, so a fault waits once (at most a second) and then
    places its pages over the budget with a warning, as before; it does not wait again
    at every fault. The program verifies. Also as nobody."""
    d = daemon("--dram", "256M", "--far-pool", "32M", "--move-limit", "off")
    cmd, rep = pool_only_run(workdir, user, "full", "rand_update", "256", "100000")
    p = subprocess.run(cmd, env=d.env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "rand_update: OK" in p.stdout, p.stdout + p.stderr
    proc = json.loads(rep.read_text())["per_process"][0]
    assert 1 <= proc["room_waits"] <= 3 and proc["room_wait_ns"] <= 3.5e9, proc
    assert proc["budget_overruns"] > 0, proc
    assert "the far tiers take no more" in p.stderr, p.stderr


@pytest.mark.parametrize("user", [None, "nobody"])
def test_a_daemon_that_dies_during_a_room_wait_ends_it(workdir, daemon, user):
    """A fault waiting for the pool to grow (`paging::room`) while the daemon cannot grant
    (stopped, then killed 400 ms into the wait) ends its wait when the connection does,
    not at its one-second limit, and the program goes on over its budget and verifies:
    the segment's pages stay mapped while the daemon is away (docs/design/pool.md). The
    program is welcomed and allocates first; the daemon is stopped before the fill
    starts. Also as nobody."""
    d = daemon("--dram", "256M", "--far-pool", "2G", "--move-limit", "off")
    cmd, rep = pool_only_run(workdir, user, "dies", "fill_on_cue", "256")
    p = subprocess.Popen(cmd, env=d.env(ATTUNE_WORKFLOW="dies"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().startswith("fill_on_cue: ready")
        for _ in range(100):
            if any(w["name"] == "dies" for w in d.status()["workflows"]):
                break
            time.sleep(0.02)
        else:
            pytest.fail("the program never joined the daemon")
        d.proc.send_signal(signal.SIGSTOP)
        p.stdin.write("\n")
        p.stdin.flush()
        time.sleep(0.4)
        d.kill()
        o, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and "fill_on_cue: OK" in o, o + err
    proc = json.loads(rep.read_text())["per_process"][0]
    # One wait: it began with the fill, in the stopped daemon's 400 ms, and ended with it.
    assert proc["room_waits"] == 1, proc
    assert 0.2e9 < proc["room_wait_ns"] < 0.9e9, proc
    assert proc["budget_overruns"] > 0, proc
    print(f"as {user or 'root'}: one wait of {proc['room_wait_ns'] / 1e6:.0f} ms")
