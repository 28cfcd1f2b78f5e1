"""SIGKILL at random points while a program's pages move between DRAM and a far tier
(issue 27's failure rule, docs/reliability.md): a program of the user `nobody` runs
random updates 8x over its DRAM budget under `attune run`, so its runtime evicts and
fetches without pause, and is killed after a random time, round after round. Nothing may
be left behind: no file and no disk space in the file tier's directory (its file is
unnamed, `O_TMPFILE`), no statistics directory, no segment or page of the node's pool in
`attuned`, no client in its status; and the next program gets the whole pool.

`ATTUNE_SIGKILL_ROUNDS` (default 8) sets the rounds per tier. Needs root (a tmpfs of its
own, a client as `nobody`) and the staged build (make build)."""
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from test_daemon import ATTUNE, MIB, as_nobody, daemon, workdir  # noqa: F401
from test_pool import build_plain, pool_fds

ROUNDS = int(os.environ.get("ATTUNE_SIGKILL_ROUNDS", "8"))

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not ATTUNE.exists(),
                                reason="needs root and the staged build")


@pytest.fixture
def tmpfs():
    """A tmpfs of this test (its used blocks are what the tier's files hold), open to all."""
    d = Path(tempfile.mkdtemp(prefix="attune-sigkill-"))
    os.chmod(d, 0o755)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=1777", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        d.rmdir()
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)])
        d.rmdir()


def used_bytes(path):
    s = os.statvfs(path)
    return (s.f_blocks - s.f_bfree) * s.f_frsize


def program_of(launcher, name, timeout=10.0):
    """The pid of `attune run`'s program, once it runs `name`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            kids = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
            for k in kids:
                if Path(f"/proc/{k}/comm").read_text().strip() == name:
                    return int(k)
        except OSError:
            pass
        assert launcher.poll() is None, launcher.communicate()
        time.sleep(0.005)
    raise AssertionError(f"{name} did not start under attune run")


def kill_at_random(argv, env, rng, low=0.05, high=1.2):
    """Starts `attune run` of a program, kills the program with SIGKILL after a random
    time (while it still runs), and returns attune run's exit code and output."""
    p = subprocess.Popen([str(ATTUNE), "run", "--dram", "8M", "--", *map(str, argv)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_nobody)
    pid = program_of(p, Path(argv[0]).name[:15])
    time.sleep(rng.uniform(low, high))
    assert p.poll() is None, "the program ended before its kill: make it run longer"
    os.kill(pid, signal.SIGKILL)
    out, err = p.communicate(timeout=30)
    return p.returncode, out + err


def scratch(workdir):
    """A directory every user can reach (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(dir=workdir))
    os.chmod(d, 0o755)
    return d


def run_env(tmp, **kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTUNE_")}
    env.update(TMPDIR=str(tmp), ATTUNE_HISTORY="off", **kw)
    return env


def test_sigkill_at_random_points_of_file_tier_traffic(workdir, tmpfs):
    rng = random.Random(int(os.environ.get("ATTUNE_SIGKILL_SEED", time.time_ns())))
    prog = build_plain(workdir, "rand_update")
    stats = scratch(workdir) / "tmp"
    stats.mkdir()
    os.chmod(stats, 0o1777)
    base = used_bytes(tmpfs)
    env = run_env(stats, ATTUNE_DAEMON="off", ATTUNE_FAR="file", ATTUNE_TIER_FILE_PATH=str(tmpfs))
    # First, that the tier takes the pages: a run that ends holds them in the tmpfs.
    p = subprocess.Popen([str(ATTUNE), "run", "--dram", "8M", "--", str(prog), "64", "100000000"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_nobody)
    pid = program_of(p, "rand_update")
    deadline = time.time() + 20
    while used_bytes(tmpfs) - base < 32 * MIB:
        assert time.time() < deadline, f"the file tier never held the pages: {used_bytes(tmpfs) - base} bytes"
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    p.communicate(timeout=30)
    for r in range(ROUNDS):
        rc, out = kill_at_random([prog, 64, 100_000_000], env, rng)
        assert rc == -signal.SIGKILL and "killed by signal 9" in out, out
        assert os.listdir(tmpfs) == [], f"round {r}: files left in the tier: {os.listdir(tmpfs)}"
        # The unnamed file's blocks go with its last descriptor, so at once.
        assert used_bytes(tmpfs) - base < MIB, f"round {r}: {used_bytes(tmpfs) - base} bytes still held"
        assert os.listdir(stats) == [], f"round {r}: left in TMPDIR: {os.listdir(stats)}"


def test_sigkill_at_random_points_of_pool_traffic(workdir, daemon):
    rng = random.Random(int(os.environ.get("ATTUNE_SIGKILL_SEED", time.time_ns())))
    prog = build_plain(workdir, "rand_update")
    d = daemon("--dram", "128M", "--far-pool", "96M", "--move-limit", "off")
    tmp = scratch(workdir)
    cfg = tmp / "pool.toml"
    spill = tmp / "spill"
    spill.mkdir()
    os.chmod(spill, 0o1777)
    cfg.write_text(f'[[tier]]\nname = "pool"\nkind = "pool"\ncapacity = "96M"\n\n'
                   f'[[tier]]\nname = "file"\nkind = "file"\npath = "{spill}"\ncapacity = "1G"\n')
    os.chmod(cfg, 0o644)
    stats = tmp / "tmp"
    stats.mkdir()
    os.chmod(stats, 0o1777)
    env = run_env(stats, ATTUNE_CONFIG=str(cfg), ATTUNE_SOCKET=d.sock)
    for r in range(ROUNDS):
        rc, out = kill_at_random([prog, 64, 100_000_000], env, rng)
        assert rc == -signal.SIGKILL and "killed by signal 9" in out, out
        deadline = time.time() + 10
        while True:
            st = d.status()
            held = st["pool_bytes"], st["far_granted"], st["granted"], st["workflows"], pool_fds(d.proc.pid)
            if held == (0, 0, 0, [], 0):
                break
            assert time.time() < deadline, f"round {r}: the dead runtime's pool is still held: {st}"
            time.sleep(0.05)
        assert os.listdir(spill) == [] and os.listdir(stats) == [], (os.listdir(spill), os.listdir(stats))
    # The next program gets the pool: most of the 56 MiB it cannot keep in DRAM go there
    # (some go to the file while its grant grows).
    rep = stats / "after.json"
    p = subprocess.run([str(ATTUNE), "run", "--dram", "8M", "--report", str(rep), "--", str(prog), "64", "200000"],
                       env=env, capture_output=True, text=True, timeout=120, preexec_fn=as_nobody)
    assert p.returncode == 0 and "rand_update: OK" in p.stdout, p.stdout + p.stderr
    tiers = {t["name"]: t for t in json.loads(rep.read_text())["tiers"]}
    assert tiers["pool"]["peak_used_bytes"] >= 48 * MIB, tiers
