"""Staged inputs for real: `attune stage` copies a file or a pipe once into attuned, every
instance maps the one copy read-only (C API, `attune run --staged`), `attune unstage` and
the end of the staging Slurm job release it, and other users get in only when granted.

Needs the staged build (make build)."""
import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test_daemon import ATTUNE, MIB, as_nobody, daemon, workdir  # noqa: F401
from test_pool import CGROUP_ROOT, needs_cgroup


def attune(d, *args, stdin=None, user=None, timeout=60):
    return subprocess.run([str(ATTUNE), *map(str, args)], env=d.env(), capture_output=True,
                          text=True, stdin=stdin, preexec_fn=as_nobody if user == "nobody" else None,
                          timeout=timeout)


def region(d, name):
    return next((r for r in d.status()["shared"] if r["name"] == name), None)


def data_file(dirpath, name, mib, mode=0o644):
    p = Path(dirpath) / name
    p.write_bytes(os.urandom(mib * MIB))
    os.chmod(p, mode)
    return p


def wait_gone(d, name, timeout=10):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if region(d, name) is None:
            return True
        time.sleep(0.1)
    return False


def test_a_file_and_a_pipe_staged_once_mapped_read_only(workdir, daemon):
    d = daemon("--dram", "512M")
    src = data_file(workdir, "input.dat", 16)
    p = attune(d, "stage", "in", src)
    assert p.returncode == 0 and f"staged 'in': {16 * MIB} bytes" in p.stdout, p
    r = region(d, "in")
    # Held by the daemon alone, all of it in memory (the daemon wrote it).
    assert r["staged"] and r["refs"] == 0 and r["size"] == 16 * MIB, r
    assert r["resident"] == 16 * MIB, r
    assert d.status()["shared_bytes"] == 16 * MIB
    # The C API maps it read-only; a store faults and changes nothing.
    out = subprocess.run([str(workdir / "client"), "staged", "in", str(src)], env=d.env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "staged: OK in" in out.stdout, out
    # An unmodified program gets its path; the launcher holds it while the program runs.
    run = subprocess.Popen(
        [str(ATTUNE), "run", "-q", "--staged", "in", "--", "sh", "-c",
         f'cmp "$ATTUNE_STAGED_IN" {src} && echo SAME; sleep 1.5'],
        env=d.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.7)
    assert region(d, "in")["refs"] == 1
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0 and "SAME" in out, (out, err)
    assert region(d, "in")["refs"] == 0
    # A pipe (the input fetched from elsewhere), read until its end; larger than one step
    # of its reservation (64 MiB).
    big = data_file(workdir, "piped.dat", 72)
    cat = subprocess.Popen(["cat", big], stdout=subprocess.PIPE)
    p = attune(d, "stage", "piped", "-", stdin=cat.stdout)
    cat.stdout.close()
    cat.wait()
    assert p.returncode == 0 and f"{72 * MIB} bytes" in p.stdout, p
    assert region(d, "piped")["size"] == 72 * MIB
    out = subprocess.run([str(workdir / "client"), "staged", "piped", str(big)], env=d.env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "staged: OK piped" in out.stdout, out
    # Unstaged with nobody holding it: freed at once; a second unstage says why not.
    for n in ("in", "piped"):
        assert attune(d, "unstage", n).returncode == 0
    assert d.status()["shared"] == [] and d.status()["shared_bytes"] == 0
    p = attune(d, "unstage", "in")
    assert p.returncode == 1 and "no staged input 'in'" in p.stderr, p


def squashfs_image(dirpath, data):
    """A SquashFS image Charliecloud can run: busybox (static: the image needs no C
    library) with `data` as /etc/input.dat, and the mount points ch-run binds over."""
    root = Path(dirpath) / "sqroot"
    for sub in ("bin", "dev", "etc", "home", "mnt", "proc", "root", "run", "sys", "tmp", "usr", "var"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy(shutil.which("busybox"), root / "bin" / "busybox")
    for applet in ("sh", "md5sum", "sleep"):
        (root / "bin" / applet).symlink_to("busybox")
    for f in ("passwd", "group", "hosts", "resolv.conf"):
        (root / "etc" / f).write_text("")
    (root / "etc" / "input.dat").write_bytes(data)
    img = Path(dirpath) / "image.sqfs"
    subprocess.run(["mksquashfs", str(root), str(img), "-quiet", "-noappend"], check=True,
                   stdout=subprocess.DEVNULL)
    shutil.rmtree(root)
    return img


def test_a_staged_squashfs_image_serves_concurrent_charliecloud_instances(workdir, daemon):
    """IMME stages container images once per node (§III-C5): a SquashFS image staged in
    attuned, then deleted from disk, runs in two Charliecloud containers at once, each
    mounting the one staged copy through its /proc/self/fd path (ch-run's own
    SquashFUSE); each reads the image's input, verified; the copy is held twice while
    they run and by the daemon alone after. Root only here: SquashFUSE needs /dev/fuse,
    which this machine gives root alone (docs/design/daemon.md)."""
    missing = [t for t in ("ch-run", "mksquashfs", "busybox") if not shutil.which(t)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (scripts/setup.sh)")
    if os.geteuid() != 0:
        pytest.skip("SquashFUSE needs /dev/fuse (root's here)")
    d = daemon("--dram", "256M")
    data = os.urandom(16 * MIB)
    img = squashfs_image(workdir, data)
    size = img.stat().st_size
    assert attune(d, "stage", "img", img).returncode == 0
    img.unlink()
    r = region(d, "img")
    assert r["staged"] and r["size"] == size and r["refs"] == 0, r
    cmd = ('ch-run "$ATTUNE_STAGED_IMG" -- /bin/sh -c "md5sum /etc/input.dat; sleep 1.5"')
    runs = [subprocess.Popen([str(ATTUNE), "run", "-q", "--staged", "img", "--", "sh", "-c", cmd],
                             env=dict(d.env(), USER="root"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    t0 = time.time()
    while region(d, "img")["refs"] < 2 and time.time() - t0 < 10:
        time.sleep(0.05)
    assert region(d, "img")["refs"] == 2, region(d, "img")
    want = hashlib.md5(data).hexdigest()
    for run in runs:
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0 and out.split()[:1] == [want], (out, err)
        # ch-run manages memory, so its runtime reads the environment: the launcher's
        # own variable is not taken for a misspelled option.
        assert "not an Attune variable" not in err, err
    assert region(d, "img")["refs"] == 0
    assert d.status()["shared_bytes"] == size
    assert attune(d, "unstage", "img").returncode == 0
    assert wait_gone(d, "img", 5)


def staged_run(d, name, src, user, *extra):
    """`attune run --staged NAME` of a program that compares its input with `src`."""
    var = "$ATTUNE_STAGED_" + name.upper()
    return subprocess.Popen([str(ATTUNE), "run", "-q", "--staged", name, *extra, "--", "sh", "-c",
                             f'cmp "{var}" {src} && echo SAME'],
                            env=d.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_nobody if user else None)


def staged_then_stopped(workdir, daemon, name, user):
    """A daemon with input `name` staged (as `user`), then stopped (SIGSTOP: the caller
    sends SIGCONT): (daemon, the input's source file)."""
    if user and os.geteuid() != 0:
        pytest.skip("needs root to run as nobody")
    d = daemon("--dram", "256M")
    src = data_file(workdir, f"{name}.dat", 1)
    assert attune(d, "stage", name, src, user=user).returncode == 0
    os.kill(d.proc.pid, signal.SIGSTOP)
    return d, src


@pytest.mark.parametrize("user", [None, "nobody"])
def test_a_launcher_waits_for_a_busy_daemon_to_answer_its_open(workdir, daemon, user):
    """`attune run --staged` cannot start its program without the input, and a daemon
    that took the connection is there: one too busy to answer in 5 s (a cold start of
    100 containers at once: bench/staging.py --image) failed the instance with "attuned:
    Resource temporarily unavailable". Stopped here for 6 s, it is waited for; as root
    and as a user who is not (the input is that user's)."""
    d, src = staged_then_stopped(workdir, daemon, "busy", user)
    try:
        run = staged_run(d, "busy", src, user)
        time.sleep(6)
        assert run.poll() is None, run.communicate()
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0 and "SAME" in out, (out, err)
    assert attune(d, "unstage", "busy", user=user).returncode == 0


@pytest.mark.parametrize("user", [None, "nobody"])
def test_a_launcher_gives_up_on_a_daemon_silent_past_its_wait(workdir, daemon, user):
    """The wait is bounded: a daemon stopped for longer than the launcher's wait (30 s
    by default; 5 s here, `--staged-wait 5`) fails the instance with a message that says
    so, and the program never runs; as root and as a user who is not."""
    d, src = staged_then_stopped(workdir, daemon, "silent", user)
    try:
        t0 = time.time()
        run = staged_run(d, "silent", src, user, "--staged-wait", "5")
        out, err = run.communicate(timeout=60)
        took = time.time() - t0
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    assert run.returncode != 0 and "SAME" not in out, (out, err)
    assert "--staged silent: no answer from attuned in 5 s" in err, err
    assert 4.5 < took < 20, f"gave up after {took:.1f} s"
    assert attune(d, "unstage", "silent", user=user).returncode == 0


def test_a_bad_staged_wait_is_refused(workdir, daemon):
    """A wait of 0, past an hour or not a number: the parser's usage error, before any
    connection or program."""
    d = daemon("--dram", "256M")
    for bad in ("0", "3601", "soon"):
        p = subprocess.run([str(ATTUNE), "run", "--staged", "x", "--staged-wait", bad, "--", "true"], env=d.env(),
                           capture_output=True, text=True)
        assert p.returncode == 2 and "--staged-wait" in p.stderr and "Traceback" not in p.stderr, (bad, p.stderr)


def restart_and_wait_for(d, name, timeout=5):
    """Kills the daemon, starts it again on its socket, and waits for region `name` to be
    given back by the launchers that hold it: its status entry, or None."""
    d.kill()
    time.sleep(0.3)
    d.start()
    t0 = time.time()
    while region(d, name) is None and time.time() - t0 < timeout:
        time.sleep(0.05)
    return region(d, name)


@pytest.mark.parametrize("user", [None, "nobody"])
def test_a_daemon_restart_gets_its_staged_input_back_from_a_running_instance(workdir, daemon, user):
    """The daemon keeps nothing on disk: after a SIGKILL and a restart, the launcher of a
    running instance gives the input back (it holds the memory file), so a new instance
    finds it staged without a new copy, and it stays, as staged by hand, until `attune
    unstage` (docs/design/daemon.md, "Restart without state on disk"). As root and as a
    user who is not (the input is that user's)."""
    if user and os.geteuid() != 0:
        pytest.skip("needs root to run as nobody")
    d = daemon("--dram", "256M")
    src = data_file(workdir, "restart.dat", 8)
    assert attune(d, "stage", "rs", src, user=user).returncode == 0
    run = subprocess.Popen(
        [str(ATTUNE), "run", "--staged", "rs", "--", "sh", "-c",
         f'sleep 3; cmp "$ATTUNE_STAGED_RS" {src} && echo SAME'],
        env=d.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=as_nobody if user else None)
    time.sleep(0.8)
    assert region(d, "rs")["refs"] == 1
    r = restart_and_wait_for(d, "rs")
    assert r is not None and r["staged"] and r["refs"] == 1 and r["size"] == 8 * MIB, r
    assert r["owner"] == (65534 if user else 0), r
    # A new instance maps the one copy, with no new stage.
    p = subprocess.run([str(ATTUNE), "run", "-q", "--staged", "rs", "--", "sh", "-c",
                        f'cmp "$ATTUNE_STAGED_RS" {src} && echo SAME'],
                       env=d.env(), capture_output=True, text=True, timeout=60,
                       preexec_fn=as_nobody if user else None)
    assert p.returncode == 0 and "SAME" in p.stdout, p
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0 and "SAME" in out, (out, err)
    assert "attuned restarted; staged input rs given back to it" in err, err
    # Held by the daemon again once its instances are gone, until unstaged.
    r = region(d, "rs")
    assert r is not None and r["staged"] and r["refs"] == 0, r
    assert d.status()["shared_bytes"] == 8 * MIB
    assert attune(d, "unstage", "rs", user=user).returncode == 0
    assert wait_gone(d, "rs", 5)


@needs_cgroup
def test_a_job_keeps_its_staged_input_across_a_daemon_restart(workdir, daemon):
    """An instance in a Slurm job's cgroup gives the input back after a restart for its
    job: the job keeps it, and it goes when the job's cgroup does, as before the restart."""
    d = daemon("--dram", "256M")
    src = data_file(workdir, "jobrs.dat", 4)
    top = CGROUP_ROOT / f"attune-rejoin-{os.getpid()}"
    job = top / "job_4301"
    job.mkdir(parents=True)
    try:
        def in_job(*args, **kw):
            return subprocess.Popen(["sh", "-c", f'echo $$ > {job}/cgroup.procs && exec "$@"', "sh",
                                     str(ATTUNE), *args], env=d.env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, **kw)
        p = in_job("stage", "jrs", str(src))
        assert p.wait(timeout=60) == 0, p.communicate()
        assert region(d, "jrs")["job"] == "4301"
        run = in_job("run", "-q", "--staged", "jrs", "--", "sh", "-c",
                     f'sleep 2; cmp "$ATTUNE_STAGED_JRS" {src} && echo SAME')
        time.sleep(0.8)
        r = restart_and_wait_for(d, "jrs")
        assert r is not None and r["staged"] and r["job"] == "4301" and r["refs"] == 1, r
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0 and "SAME" in out, (out, err)
        time.sleep(1.5)
        assert region(d, "jrs") is not None, "kept while its job lives"
        job.rmdir()
        assert wait_gone(d, "jrs", 5), d.status()
    finally:
        for c in (job, top):
            if c.exists():
                c.rmdir()


def test_unstaged_while_in_use_lives_until_its_last_user(workdir, daemon):
    d = daemon("--dram", "512M")
    src = data_file(workdir, "held.dat", 4)
    assert attune(d, "stage", "held", src).returncode == 0
    run = subprocess.Popen(
        [str(ATTUNE), "run", "-q", "--staged", "held", "--", "sh", "-c",
         f'sleep 1.5; cmp "$ATTUNE_STAGED_HELD" {src} && echo SAME'],
        env=d.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    assert attune(d, "unstage", "held").returncode == 0
    r = region(d, "held")
    assert r is not None and not r.get("staged") and r["refs"] == 1, r
    # Nobody new may stage over it while it lives.
    p = attune(d, "stage", "held", src)
    assert p.returncode == 1 and "exists already" in p.stderr, p
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0 and "SAME" in out, (out, err)
    assert wait_gone(d, "held", 5), d.status()


def test_bad_input_is_refused_with_a_reason_and_leaves_nothing(workdir, daemon, tmp_path):
    d = daemon("--dram", "256M", "--shared-max", "8M")
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    big = data_file(tmp_path, "big", 12)
    small = data_file(tmp_path, "small", 1)
    cases = [
        (("stage", "x", tmp_path / "missing"), None, "No such file"),
        (("stage", "x", tmp_path), None, "not a regular file"),
        (("stage", "x", empty), None, "empty"),
        (("stage", "bad/name", small), None, "staged input name"),
        (("stage", "x", small, "--flags", "FAST"), None, "--flags"),
        (("stage", "x", big), None, "left of shared_max"),
        (("stage", "x", "-", "--size", "256K"), big, "more than the 262144 bytes"),
        (("stage", "x", "-"), big, "shared_max"),
        (("run", "--staged", "nothere", "--", "true"), None, "no shared region 'nothere'"),
        (("unstage", "nothere"), None, "no staged input"),
    ]
    for args, pipe_from, msg in cases:
        # A pipe, as from `curl URL | attune stage x -`.
        cat = subprocess.Popen(["cat", pipe_from], stdout=subprocess.PIPE) if pipe_from else None
        p = attune(d, *args, stdin=cat.stdout if cat else None)
        if cat:
            cat.stdout.close()
            cat.wait()
        assert p.returncode != 0 and msg in p.stderr, (args, p)
        assert d.status()["shared"] == [], (args, d.status()["shared"])
    # A region opened with attune_shared_open is not unstaged, and a staged name is taken.
    assert attune(d, "stage", "x", small).returncode == 0
    p = attune(d, "stage", "x", small)
    assert p.returncode == 1 and "exists already" in p.stderr, p
    assert attune(d, "unstage", "x").returncode == 0
    # `attune stage` interrupted (Ctrl-C) while its pipe stays open: the staging stops and its
    # reservation goes, without waiting for the pipe.
    w = subprocess.Popen(["sh", "-c", f"cat {small}; exec sleep 30"], stdout=subprocess.PIPE)
    # Ctrl-C as in a terminal: SIGINT at its default action (a runner that started the
    # tests in the background may have left it ignored, which the child would inherit).
    st = subprocess.Popen([str(ATTUNE), "stage", "x", "-"], env=d.env(), stdin=w.stdout,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(0.7)
    assert region(d, "x")["staged"], "reserved while it is copied"
    st.send_signal(signal.SIGINT)  # Ctrl-C
    st.wait()
    assert wait_gone(d, "x", 5), d.status()
    w.kill()
    w.wait()
    # No daemon: a clear error.
    p = subprocess.run([str(ATTUNE), "stage", "x", small, "--socket", tmp_path / "none.sock"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "no attuned answers" in p.stderr, p


def test_a_pipe_that_goes_silent_fails_its_staging_and_leaves_nothing(workdir, daemon, tmp_path):
    """A writer that stops without closing its pipe (a stalled download) fails the
    staging after `stage_idle_ms` (60 s by default; 1.5 s here): `attune stage` says
    why, and the reservation goes."""
    d = daemon("--dram", "256M", "--stage-idle-ms", "1500")
    small = data_file(tmp_path, "small", 1)
    w = subprocess.Popen(["sh", "-c", f"cat {small}; exec sleep 30"], stdout=subprocess.PIPE)
    try:
        t0 = time.monotonic()
        p = attune(d, "stage", "quiet", "-", stdin=w.stdout)
        took = time.monotonic() - t0
    finally:
        w.kill()
        w.wait()
    assert p.returncode != 0 and "brought nothing for 1500 ms" in p.stderr, p
    assert 1.4 <= took < 20, took
    assert region(d, "quiet") is None and d.status()["shared_bytes"] == 0, d.status()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another uid")
def test_another_user_needs_a_grant_and_cannot_unstage(workdir, daemon):
    d = daemon("--dram", "512M")
    src = data_file(workdir, "root-only.dat", 2, mode=0o644)
    assert attune(d, "stage", "mine", src).returncode == 0
    p = subprocess.run([str(workdir / "client"), "refused", "mine"], env=d.env(),
                       capture_output=True, text=True, preexec_fn=as_nobody, timeout=30)
    assert p.returncode == 0 and "refused: OK" in p.stdout, p
    p = attune(d, "run", "--staged", "mine", "--", "true", user="nobody")
    assert p.returncode == 2 and "has not granted" in p.stderr, p
    p = attune(d, "unstage", "mine", user="nobody")
    assert p.returncode == 1 and "only its owner or root" in p.stderr, p
    p = attune(d, "stage", "--reuse", "mine", src, user="nobody")
    assert p.returncode == 1 and "has not granted" in p.stderr, p
    # Granted at staging: nobody reads it, verified.
    assert attune(d, "stage", "shared-in", src, "--grant", 65534).returncode == 0
    p = subprocess.run([str(workdir / "client"), "staged", "shared-in", str(src)], env=d.env(),
                       capture_output=True, text=True, preexec_fn=as_nobody, timeout=30)
    assert p.returncode == 0 and "staged: OK" in p.stdout, p
    # The daemon reads only what the user could open: a file nobody cannot read is refused
    # by the user's own open, before any daemon sees it.
    secret = data_file(workdir, "secret.dat", 1, mode=0o600)
    p = attune(d, "stage", "stolen", secret, user="nobody")
    assert p.returncode == 1 and "Permission denied" in p.stderr, p
    assert region(d, "stolen") is None
    # nobody's own input is nobody's.
    p = attune(d, "stage", "theirs", src, user="nobody")
    assert p.returncode == 0, p
    assert region(d, "theirs")["owner"] == 65534
    for n in ("mine", "shared-in"):
        assert attune(d, "unstage", n).returncode == 0
    # Root may unstage any.
    assert attune(d, "unstage", "theirs").returncode == 0
    assert d.status()["shared"] == []


def test_reuse_keeps_one_copy_and_waits_for_one_being_staged(workdir, daemon):
    d = daemon("--dram", "512M")
    src = data_file(workdir, "reuse.dat", 4)
    # A second stager of the same name waits for the copy in progress, then reuses it.
    w = subprocess.Popen(["sh", "-c", f"cat {src}; exec sleep 1"], stdout=subprocess.PIPE)
    first = subprocess.Popen([str(ATTUNE), "stage", "r", "-"], env=d.env(), stdin=w.stdout,
                             stdout=subprocess.PIPE, text=True)
    w.stdout.close()
    time.sleep(0.3)
    p = attune(d, "stage", "--reuse", "r", src)
    assert p.returncode == 0 and "staged already" in p.stdout, p
    assert first.wait(timeout=30) == 0 and w.wait(timeout=30) == 0
    assert [x["name"] for x in d.status()["shared"]] == ["r"]
    out = subprocess.run([str(workdir / "client"), "staged", "r", str(src)], env=d.env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out
    # Without --reuse the name is taken; a writable region is not a staged input.
    assert "exists already" in attune(d, "stage", "r", src).stderr
    hold = subprocess.Popen([str(workdir / "client"), "write", "rw", "1", "3"], env=d.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(100):
        if region(d, "rw"):
            break
        time.sleep(0.05)
    p = attune(d, "stage", "--reuse", "rw", src)
    assert p.returncode == 1 and "writable shared region" in p.stderr, p
    hold.kill()
    hold.wait()
    assert attune(d, "unstage", "r").returncode == 0
    assert wait_gone(d, "r", 5)


@needs_cgroup
def test_a_slurm_jobs_input_goes_when_its_last_job_cgroup_does(workdir, daemon):
    """slurmd removes a job's cgroup when the job ends, however it ends: the daemon's
    watcher drops each ended job of a staged input and unstages it after the last (two
    array tasks: one stages, the other reuses). Jobs are cgroups named as slurmd names
    them."""
    d = daemon("--dram", "512M")
    src = data_file(workdir, "job.dat", 2)
    top = CGROUP_ROOT / f"attune-stagetest-{os.getpid()}"
    jobs = [top / "job_4242", top / "job_4243"]
    for j in jobs:
        j.mkdir(parents=True)

    def stage_in(job, *extra):
        return subprocess.run(["sh", "-c", f'echo $$ > {job}/cgroup.procs && exec "$@"', "sh",
                               str(ATTUNE), "stage", *extra, "job-in", str(src)],
                              env=d.env(), capture_output=True, text=True, timeout=60)
    try:
        p = stage_in(jobs[0])
        assert p.returncode == 0, p
        p = stage_in(jobs[1], "--reuse")
        assert p.returncode == 0 and "staged already" in p.stdout, p
        r = region(d, "job-in")
        assert r["staged"] and r["job"] == "4242,4243", r
        time.sleep(1.5)
        assert region(d, "job-in") is not None, "kept while its jobs live"
        jobs[0].rmdir()
        time.sleep(1.5)
        r = region(d, "job-in")
        assert r is not None and r["job"] == "4243", r
        jobs[1].rmdir()
        assert wait_gone(d, "job-in", 5), d.status()
    finally:
        for c in (*jobs, top):
            if c.exists():
                c.rmdir()
