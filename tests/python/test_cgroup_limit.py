"""A memory cgroup limit below the DRAM budget (issue 27's failure rule): a job's limit
(Slurm's --mem, a container's) is tighter than what the user asked Attune to keep. The
runtime reads the limit of its cgroup and its ancestors at start, lowers the budget to
the limit less room for the program's own memory, and holds the far tiers whose pages
are the process's own (memory, NUMA) to what is left, with a warning naming the figures
(docs/design/paging.md, "Budgets under a memory cgroup"). Without that the kernel killed
the program at its limit before the evictor acted.

Real cgroups v1, as root, the programs run as nobody."""
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from test_daemon import ATTUNE, MIB, ROOT
from test_pool import Cgroup, needs_cgroup

LIMIT = 192 * MIB
def CAP_AT(limit):
    return limit - max(limit // 100 * 10, 32 * MIB)  # Machine::limit_for_managed


CAP = CAP_AT(LIMIT)


@pytest.fixture(scope="module")
def work():
    # Reachable by nobody (pytest's own directories are root's, 0700); reports land here.
    d = Path(tempfile.mkdtemp(prefix="attune-cgtest-"))
    os.chmod(d, 0o777)
    subprocess.run(["gcc", "-O2", str(ROOT / "tests/run/c_matrix.c"), "-o", str(d / "c_matrix")], check=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def c_matrix(work):
    return work / "c_matrix"


def as_nobody(argv):
    return ["runuser", "-u", "nobody", "--", *map(str, argv)]


def env(**kw):
    # The in-process memory tier named: its pages are the process's own, which is what the
    # limit rule holds (the default far tier is a file: tests/python/test_far_default.py).
    e = {k: v for k, v in os.environ.items() if not k.startswith("ATTUNE_")}
    e.update(ATTUNE_DAEMON="off", ATTUNE_FAR="memory,file", TMPDIR="/tmp")
    e.update(kw)
    return e


def hwm(out):
    """The program's own resident high-water mark (c_matrix prints VmHWM): the cgroup's
    peak also counts the file tier's page cache, which the kernel reclaims at the limit."""
    return int(re.search(r"VmHWM_KiB=(\d+)", out).group(1)) * 1024


def attune_run_under_limit(work, name, dram, c_matrix, **kw):
    """`attune run --dram DRAM -- c_matrix 320` as nobody in a new cgroup of LIMIT: the run
    (verified, not OOM-killed), its report and its first process's tiers by name."""
    g = Cgroup(name, LIMIT)
    try:
        rep = work / f"{name}.json"
        p = run_in(g, [ATTUNE, "run", "--dram", dram, "--report", rep, "--", c_matrix, "320"], **kw)
        assert p.returncode == 0 and "c_matrix: OK" in p.stdout, p.stdout + p.stderr
        assert g.oom_kills() == 0
    finally:
        g.remove()
    r = json.loads(rep.read_text())
    return p, r, {t["name"]: t for t in r["per_process"][0]["tiers"]}


def run_in(g, argv, **kw):
    return subprocess.run(g.wrap(as_nobody(argv)), env=env(**kw), capture_output=True, text=True,
                          timeout=300)


@needs_cgroup
def test_a_budget_above_the_limit_is_lowered_and_the_program_finishes(c_matrix, work):
    g = Cgroup("budget", LIMIT)
    try:
        # The program alone does not fit its limit: the kernel kills it.
        p = run_in(g, [c_matrix, "320"])
        assert p.returncode != 0 and "c_matrix: OK" not in p.stdout, p
        assert g.peak() >= LIMIT - MIB
    finally:
        g.remove()
    # `follow_limit` on, as users run: the buffered file tier's stores are dirty page cache
    # charged to the cgroup, and before their write-back was started at each store the
    # budget followed them down to 1 MiB (docs/reliability.md, "Dirty pages of a buffered
    # file tier"); the budget at exit is the cap.
    p, r, tiers = attune_run_under_limit(work, "budget2", "1G", c_matrix)
    assert f"lowered to {CAP} bytes" in p.stderr and str(LIMIT) in p.stderr, p.stderr
    # The budget fills the limit's share: the memory tier has no room and is left out;
    # the file tier holds the rest.
    assert "far tier 'memory' is left out" in p.stderr, p.stderr
    assert CAP - 8 * MIB < hwm(p.stdout) < LIMIT - 16 * MIB, p.stdout
    assert r["totals"]["budget_bytes"] == CAP and tiers["dram"]["capacity"] == CAP, tiers
    assert "memory" not in tiers and tiers["file"]["peak_used_bytes"] > 100 * MIB, tiers


@needs_cgroup
def test_the_memory_tier_gets_what_the_budget_leaves(c_matrix, work):
    p, _, tiers = attune_run_under_limit(work, "memtier", "96M", c_matrix)
    left = CAP - 96 * MIB
    assert f"far tier 'memory' holds at most {left} bytes" in p.stderr, p.stderr
    # Resident: the budget and the memory tier's pages (mapped from its memfd).
    assert hwm(p.stdout) < LIMIT - 16 * MIB, p.stdout
    assert tiers["memory"]["capacity"] == left, tiers
    assert tiers["memory"]["peak_used_bytes"] <= left, tiers
    assert tiers["file"]["peak_used_bytes"] > 0, tiers


@needs_cgroup
def test_within_the_limit_nothing_changes(c_matrix, work):
    """Defaults under a limit are percentages of the limit: nothing to lower, no warning."""
    g = Cgroup("defaults", LIMIT)
    try:
        p = run_in(g, [ATTUNE, "run", "--", c_matrix, "96"])
        assert p.returncode == 0 and "c_matrix: OK" in p.stdout, p.stdout + p.stderr
        assert "cgroup" not in p.stderr, p.stderr
    finally:
        g.remove()



GROW = """
import sys, time
n = int(sys.argv[1]) << 20
buf = bytearray(n)  # one managed region
for i in range(0, n, 4096):
    buf[i] = (i >> 12) & 255
# Then the interpreter's own heap grows (arenas it maps itself, outside Attune) past the
# room the limit kept for it: about 70 MiB, in a tenth of a second or in ten steps.
objs, steps, pause = [], int(sys.argv[3]), float(sys.argv[4])
for s in range(steps):
    objs += [str(i) * 2 for i in range(int(sys.argv[2]) // steps)]
    time.sleep(pause)
bad = sum(1 for i in range(0, n, 4096) if buf[i] != (i >> 12) & 255)
print("grow: bad", bad, "objs", len(objs), flush=True)
sys.exit(1 if bad else 0)
"""


@needs_cgroup
@pytest.mark.parametrize("far,dram,tier_env,steps", [
    ("auto", "1G", {}, ["1", "0"]),
    # The memory tier gets what a 64 MiB budget leaves (64 MiB); the file tier bypasses
    # the page cache, as `auto` makes it under a limit (buffered stores are charged too).
    # Its regions move 4 KiB chunks, which a file takes at less than the 700 MB/s the heap
    # grows by at once: the heap grows in ten steps (docs/design/paging.md says the bound).
    ("memory,file", "64M", {"ATTUNE_TIER_FILE_DIRECT": "true"}, ["10", "0.02"]),
])
def test_the_budget_follows_what_the_program_holds_outside(work, far, dram, tier_env, steps):
    """A Python program fills a buffer up to its budget (the limit less the room), then its
    own heap grows past that room (docs/design/paging.md, "Budgets under a memory
    cgroup"). With a fixed budget the kernel kills it at the limit; following the
    cgroup's usage, the runtime lowers the budget as the heap grows, moves the buffer's
    pages out, and the program finishes with its data intact. With the in-process memory
    tier the lowered budget also leaves that tier's room (it is charged to the job too)."""
    prog = work / "grow.py"
    prog.write_text(GROW)
    limit = 160 * MIB
    argv = ["/usr/bin/python3", prog, "112", "1100000", *steps]
    fixed = Cgroup("fixed", limit)
    try:
        p = run_in(fixed, [ATTUNE, "run", "-q", "--dram", dram, "--", *argv],
                   ATTUNE_FAR=far, ATTUNE_FOLLOW_LIMIT="false", **tier_env)
        assert p.returncode != 0 and "grow: bad 0" not in p.stdout, p.stdout + p.stderr
        assert fixed.oom_kills() >= 1
    finally:
        fixed.remove()
    g = Cgroup("follow", limit)
    try:
        rep = work / f"follow-{far}.json"
        p = run_in(g, [ATTUNE, "run", "--dram", dram, "--report", rep, "--", *argv],
                   ATTUNE_FAR=far, **tier_env)
        assert p.returncode == 0 and "grow: bad 0 objs 1100000" in p.stdout, p.stdout + p.stderr
        assert g.oom_kills() == 0
    finally:
        g.remove()
    assert "DRAM budget lowered from" in p.stderr and "follow_limit" in p.stderr, p.stderr
    assert "memory cgroup: limit 160.0 MiB" in p.stderr, p.stderr
    proc = json.loads(rep.read_text())["per_process"][0]
    assert proc["cgroup_limit_bytes"] == limit and proc["cgroup_lowered"] >= 1, proc
    # The heap outside Attune reached about 70 MiB over the interpreter's own; the budget
    # went well below what it started at, so the buffer's pages went to a far tier and
    # came back intact.
    assert 60 * MIB < proc["cgroup_outside_peak_bytes"] < limit, proc
    start = min(CAP_AT(limit), int(dram[:-1]) << (30 if dram.endswith("G") else 20))
    assert proc["cgroup_lowest_budget_bytes"] < start - 40 * MIB, proc
    assert proc["evicted_bytes"] > 16 * MIB, proc


MOVED = """
import sys, time
print("ready", flush=True)
sys.stdin.readline()  # the test has moved the job to another group
time.sleep(1.5)  # the runtime looks at its groups once a second
n = int(sys.argv[1]) << 20
buf = bytearray(n)  # one managed region, above the new group's limit
for i in range(0, n, 4096):
    buf[i] = (i >> 12) & 255
bad = sum(1 for i in range(0, n, 4096) if buf[i] != (i >> 12) & 255)
print("moved: bad", bad, flush=True)
sys.exit(1 if bad else 0)
"""


@needs_cgroup
def test_a_job_moved_to_a_tighter_group_follows_the_new_limit(work):
    """A job moved to another memory cgroup (a Slurm step, an administrator's
    `cgclassify`) follows the new group's limit within a second, and the group it
    started in may then be removed: before, the runtime kept reading the first group (and
    took no cap at all once it was gone), so the budget stayed where the old, wider limit
    had put it, and a buffer filled after the move was killed in the new group. The
    buffer is made after the move: cgroup v1 leaves charges made before a move in the old
    group (this kernel refuses `memory.move_charge_at_immigrate`), and the runtime cannot
    tell which of its pages are charged where."""
    prog = work / "moved.py"
    prog.write_text(MOVED)
    wide, tight = Cgroup("wide", 512 * MIB), Cgroup("tight", 192 * MIB)
    rep = work / "moved.json"
    try:
        p = subprocess.Popen(
            wide.wrap(as_nobody([ATTUNE, "run", "--dram", "1G", "--report", rep, "--",
                                 "/usr/bin/python3", prog, "300"])),
            env=env(ATTUNE_FAR="file", ATTUNE_TIER_FILE_DIRECT="true"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "ready", p.communicate(timeout=60)
            for pid in (wide.path / "cgroup.procs").read_text().split():
                (tight.path / "cgroup.procs").write_text(pid)
            wide.remove()
            assert not wide.path.exists()
            out, err = p.communicate("go\n", timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 0 and "moved: bad 0" in out, out + err
        assert tight.oom_kills() == 0
    finally:
        wide.remove()
        tight.remove()
    proc = json.loads(rep.read_text())["per_process"][0]
    # The last reading is the new group's, and it lowered the budget below that limit
    # (it started under the wide group's: 512 MiB less the room); the 300 MiB buffer went
    # partly to the far tier.
    assert proc["cgroup_limit_bytes"] == 192 * MIB and proc["cgroup_lowered"] >= 1, proc
    assert proc["cgroup_lowest_budget_bytes"] < 192 * MIB, proc
    assert proc["evicted_bytes"] > 64 * MIB, proc
