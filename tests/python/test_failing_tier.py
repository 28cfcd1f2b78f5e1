"""A file tier whose file system fails mid-run (issue 27's failure rule): ext4 on a loop
device, mounted `errors=remount-ro`, is made to report an error (the kernel's own
`/sys/fs/ext4/<dev>/trigger_fs_error`), and remounts itself read-only while a program of
the user `nobody` runs under `attune run` with that file as its only far tier.

Before the rule the handler thread retried the failing writes chunk after chunk on every
fault: 570 faults a second, 100% of a core, the program as good as hung. Now the tier is
left alone for a while (`tier::FAILED_BACKOFF_NS`), a warning names the error, what the
tier holds is still read, and the program finishes with its data verified, above its
budget (docs/design/paging.md, "Full or failing tiers").

A disk whose reads fail is the other half: the only copy of a page cannot be read back,
and the access that needs it ends with SIGBUS and a message (a FUSE file system of the
test's, tests/c/eio_fs.c, fails its reads with EIO on demand)."""
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ATTUNE = ROOT / "build" / "bin" / "attune"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("mkfs.ext4") or not ATTUNE.exists(),
    reason="needs root, mkfs.ext4 and a loop device, and the staged build")


@pytest.fixture
def ext4():
    d = Path(tempfile.mkdtemp(prefix="attune-ro-"))
    os.chmod(d, 0o755)
    img, mnt = d / "fs.img", d / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(512 << 20)
    subprocess.run(["mkfs.ext4", "-q", str(img)], check=True)
    r = subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(img), str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(d)
        pytest.skip(f"cannot mount a loop device here: {r.stderr.strip()}")
    os.chmod(mnt, 0o1777)
    dev = next(line.split()[0] for line in Path("/proc/mounts").read_text().splitlines()
               if line.split()[1] == str(mnt))
    try:
        yield mnt, Path("/sys/fs/ext4") / os.path.basename(dev)
    finally:
        subprocess.run(["umount", str(mnt)])
        shutil.rmtree(d, ignore_errors=True)


def mount_options(mnt):
    for line in Path("/proc/mounts").read_text().splitlines():
        f = line.split()
        if f[1] == str(mnt):
            return f[3].split(",")
    return []


@pytest.fixture
def rand_update():
    """tests/run/rand_update.c built where `nobody` can run it."""
    exe = Path(tempfile.mkdtemp(prefix="attune-tier-bin-"))
    os.chmod(exe, 0o755)
    subprocess.run(["gcc", "-O2", str(ROOT / "tests/run/rand_update.c"), "-o", str(exe / "rand_update")],
                   check=True)
    yield exe / "rand_update"
    shutil.rmtree(exe, ignore_errors=True)


def start_on_file_tier(prog, tier_dir, mib, updates, *run_args):
    """`attune run` of `prog MIB UPDATES` as nobody, on a 16 MiB budget with `tier_dir`
    as its only far tier (a file tier)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTUNE_")}
    env.update(ATTUNE_DAEMON="off", ATTUNE_FAR="file", ATTUNE_TIER_FILE_PATH=str(tier_dir))
    return subprocess.Popen(["runuser", "-u", "nobody", "--", str(ATTUNE), "run", *run_args, "--dram", "16M", "--",
                             str(prog), str(mib), str(updates)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_file_tier_remounted_read_only_mid_run(ext4, rand_update):
    mnt, sysfs = ext4
    if not (sysfs / "trigger_fs_error").exists():
        pytest.skip("this kernel has no ext4 trigger_fs_error")
    p = start_on_file_tier(rand_update, mnt, 128, 900000)
    # Once the far tier holds data (some of which must be read back after the error;
    # its file is unlinked at creation, so there is nothing to watch in the directory).
    time.sleep(1.5)
    assert p.poll() is None, "the program ended before the error could be caused"
    (sysfs / "trigger_fs_error").write_text("1")
    timer = threading.Timer(120, p.kill)
    timer.start()
    out, err = p.communicate()
    timer.cancel()
    opts = mount_options(mnt)
    assert "ro" in opts or "emergency_ro" in opts, opts
    assert p.returncode == 0 and "rand_update: OK" in out, out + err
    assert "far tier 'file' failed a write (Read-only file system" in err, err
    # The budget is not kept without a far tier, and it says so.
    assert "above the DRAM budget of 16 MiB" in err, err


@pytest.fixture
def eio_fs():
    """A FUSE file system over a backing directory whose reads fail with EIO while a flag
    file exists (tests/c/eio_fs.c): a disk with bad sectors, on a kernel without
    device-mapper. Yields (mount point, backing directory, flag file)."""
    if not Path("/dev/fuse").exists() or subprocess.run(["pkg-config", "--exists", "fuse3"]).returncode != 0:
        pytest.skip("needs /dev/fuse and libfuse3-dev")
    d = Path(tempfile.mkdtemp(prefix="attune-eio-"))
    os.chmod(d, 0o755)
    back, mnt, flag = d / "back", d / "mnt", d / "flag"
    back.mkdir()
    mnt.mkdir()
    os.chmod(back, 0o1777)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True,
                           check=True).stdout.split()
    subprocess.run(["gcc", "-O2", str(ROOT / "tests/c/eio_fs.c"), "-o", str(d / "eio_fs"), *flags], check=True)
    fs = subprocess.Popen([str(d / "eio_fs"), str(back), str(flag), str(mnt), "-f", "-o",
                           "allow_other,default_permissions"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    deadline = time.time() + 10
    while str(mnt) not in [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]:
        if fs.poll() is not None or time.time() > deadline:
            shutil.rmtree(d, ignore_errors=True)
            pytest.skip(f"cannot mount a FUSE file system here: {fs.communicate()[0]}")
        time.sleep(0.05)
    try:
        yield mnt, back, flag
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)])
        try:
            fs.wait(timeout=10)
        except subprocess.TimeoutExpired:
            fs.kill()
            fs.wait()
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("delivery", ["thread", "signal"])
def test_a_file_tier_whose_reads_fail_stops_the_program_with_sigbus(eio_fs, rand_update, delivery):
    """The only copy of a page is on a disk that now fails its reads (EIO): the access
    that needs the page ends with SIGBUS and a message, never with other data, under both
    fault deliveries; nothing is left in the tier's directory."""
    mnt, back, flag = eio_fs
    p = start_on_file_tier(rand_update, mnt, 64, 100000000, "--fault-mode", delivery)
    # The tier holds most of the 64 MiB after a second (the backing file grows).
    time.sleep(1.5)
    assert p.poll() is None, p.communicate()
    flag.touch()
    timer = threading.Timer(60, p.kill)
    timer.start()
    out, err = p.communicate()
    timer.cancel()
    assert "FAIL" not in out, out
    assert "a page could not be read back from its tier (EIO); the access fails with SIGBUS" in err, err
    # runuser passes the death by signal on as 128 + SIGBUS.
    assert "killed by signal 7" in err and p.returncode == 128 + signal.SIGBUS, (p.returncode, err)
    # The named file (FUSE has no O_TMPFILE) was unlinked at once; nothing is left.
    assert os.listdir(back) == [], os.listdir(back)
