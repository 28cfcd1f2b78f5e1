"""The default far tier (`far = "auto"`, docs/design/paging.md, "The default far tier"):
without a configured far tier the pages that leave DRAM leave the process too: to a file
on local scratch (O_DIRECT under a memory cgroup limit), or to attuned's pool when its
socket is there. The in-process `memory` tier, named, keeps them in the program's RSS.

Needs the staged build (make build)."""
import json
import os
import re
import socket
import subprocess

import pytest

from test_daemon import MIB, as_nobody, daemon, workdir  # noqa: F401
from test_pool import ATTUNE, Cgroup, build_plain, needs_cgroup


def hwm_mib(out):
    m = re.search(r"c_matrix: OK footprint=(\d+) MiB VmHWM_KiB=(\d+)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2)) >> 10


def run(argv, env, **kw):
    return subprocess.run([str(a) for a in argv], env=env, capture_output=True, text=True, timeout=300, **kw)


def no_daemon(workdir, **kw):
    e = dict(os.environ, ATTUNE_SOCKET=str(workdir / "no-daemon.sock"), ATTUNE_LOG="info")
    e.pop("ATTUNE_FAR", None)
    e.pop("ATTUNE_CONFIG", None)
    e.update({k: str(v) for k, v in kw.items()})
    return e


def test_without_a_far_device_far_pages_leave_the_process(workdir):
    """A 128 MiB program on 16 MiB of DRAM: under the default its peak RSS stays near the
    budget and every buffer verifies; with the memory tier named it holds the footprint."""
    prog = build_plain(workdir, "c_matrix")
    p = run([ATTUNE, "run", "--dram", "16M", "--", prog, 128], no_daemon(workdir))
    assert p.returncode == 0, p.stdout + p.stderr
    footprint, hwm = hwm_mib(p.stdout)
    assert footprint >= 128 and hwm < 48, (footprint, hwm, p.stderr)
    assert "far tiers: file in " in p.stderr and "auto: no CPU-less NUMA node, no attuned socket" in p.stderr, p.stderr
    # The run report says it too.
    assert "far tiers: auto: no CPU-less NUMA node" in p.stderr, p.stderr
    p = run([ATTUNE, "run", "--far", "memory,file", "--dram", "16M", "--", prog, 128], no_daemon(workdir))
    assert p.returncode == 0, p.stdout + p.stderr
    _, hwm_memory = hwm_mib(p.stdout)
    assert hwm_memory >= footprint, (hwm_memory, footprint)
    assert 'far tiers: far = "memory,file"' in p.stderr, p.stderr


@needs_cgroup
def test_under_a_cgroup_limit_the_file_tier_bypasses_the_page_cache(workdir):
    """In a 64 MiB memory cgroup the default file tier is O_DIRECT: the job's charge stays
    well below its limit (buffered, its far pages would come back as page cache charged to
    it and fill the limit), nothing is killed, every buffer verifies."""
    prog = build_plain(workdir, "c_matrix")
    g = Cgroup("far-auto", 64 * MIB)
    try:
        rep = workdir / "auto.json"
        p = run(g.wrap([ATTUNE, "run", "--dram", "24M", "--report", rep, "--", prog, 128]), no_daemon(workdir))
        assert p.returncode == 0 and "c_matrix: OK" in p.stdout, p.stdout + p.stderr
        assert g.oom_kills() == 0
        assert g.peak() < 56 * MIB, f"peak {g.peak() >> 20} MiB"
        r = json.loads(rep.read_text())
        reasons = {q.get("far_reason") for q in r["per_process"]}
        assert any(x and "O_DIRECT" in x for x in reasons), reasons
        far = [t for t in r["tiers"] if t["kind"] != "dram"]
        assert [t["kind"] for t in far] == ["file"], r["tiers"]
        assert far[0]["peak_used_bytes"] > 64 * MIB, r["tiers"]
    finally:
        g.remove()


def test_with_attuned_the_default_is_its_pool(workdir, daemon):
    """attuned's socket: the node's far pool, then a file; the segment is attached and the
    data verifies."""
    d = daemon("--dram", "256M", "--far-pool", "512M", "--move-limit", "off")
    prog = build_plain(workdir, "c_matrix")
    rep = workdir / "pool.json"
    p = run([ATTUNE, "run", "--dram", "32M", "--report", rep, "--", prog, 128],
            dict(no_daemon(workdir), ATTUNE_SOCKET=d.sock))
    assert p.returncode == 0 and "c_matrix: OK" in p.stdout, p.stdout + p.stderr
    assert "segment of the node's far pool attached" in p.stderr, p.stderr
    r = json.loads(rep.read_text())
    far = [t for t in r["tiers"] if t["kind"] != "dram"]
    assert [t["kind"] for t in far] == ["pool", "file"], r["tiers"]
    assert far[0]["peak_used_bytes"] > 64 * MIB, r["tiers"]
    assert any("far pool" in (q.get("far_reason") or "") for q in r["per_process"]), r["per_process"]


def test_a_dead_daemons_socket_loses_nothing(workdir):
    """A socket file left by a daemon that is gone: `auto` takes the pool, the runtime
    finds no daemon, and what leaves DRAM goes to the file tier; every buffer verifies."""
    stale = workdir / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()
    prog = build_plain(workdir, "c_matrix")
    rep = workdir / "stale.json"
    p = run([ATTUNE, "run", "--dram", "16M", "--report", rep, "--", prog, 96],
            dict(no_daemon(workdir), ATTUNE_SOCKET=str(stale)))
    assert p.returncode == 0 and "c_matrix: OK" in p.stdout, p.stdout + p.stderr
    r = json.loads(rep.read_text())
    far = {t["kind"]: t for t in r["tiers"] if t["kind"] != "dram"}
    assert list(far) == ["pool", "file"], r["tiers"]
    assert far["pool"]["peak_used_bytes"] == 0 and far["file"]["peak_used_bytes"] > 48 * MIB, r["tiers"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another uid")
def test_a_user_who_is_not_root_gets_the_same_default(workdir, daemon):
    """As nobody, with and without attuned: the pool, or a file in /tmp; data verified."""
    prog = build_plain(workdir, "c_matrix")
    os.chmod(prog, 0o755)
    env = no_daemon(workdir, TMPDIR="/tmp", HOME="/tmp")
    p = run([ATTUNE, "run", "--dram", "16M", "--", prog, 96], env, preexec_fn=as_nobody)
    assert p.returncode == 0, p.stdout + p.stderr
    assert hwm_mib(p.stdout)[1] < 48, p.stdout
    assert "far tiers: file in /tmp" in p.stderr, p.stderr
    # A $TMPDIR this user can see but not write (/, as another user's would be): the
    # next scratch directory is taken, not a file tier that fails at its first store.
    p = run([ATTUNE, "run", "--dram", "16M", "--", prog, 96], dict(env, TMPDIR="/"), preexec_fn=as_nobody)
    assert p.returncode == 0, p.stdout + p.stderr
    assert hwm_mib(p.stdout)[1] < 48, p.stdout
    assert "far tiers: file in /tmp" in p.stderr, p.stderr
    d = daemon("--dram", "256M", "--far-pool", "512M", "--move-limit", "off")
    p = run([ATTUNE, "run", "--dram", "16M", "--", prog, 96], dict(env, ATTUNE_SOCKET=d.sock), preexec_fn=as_nobody)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "segment of the node's far pool attached" in p.stderr, p.stderr
