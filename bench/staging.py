"""Cold start of an ensemble with and without a staged input (issue 26, item 4; IMME
§III-C5), side by side in one run.

A compute node and a store are two hosts (network namespaces on a bridge, the hosts of
tests/python/test_remote.py); the store serves the input over HTTP through a link capped
with `tbf` (--rate), as a site's shared storage or image registry would. N instances start
at once on the node, each in a bubblewrap container when bwrap is installed, and each
brings the whole input into memory and reads it (bench/stage_reader.c, checksum checked
against the source). Variants, interleaved in each repetition:

  fetch   each instance fetches its own copy from the store (what a job does today
          without a node-local copy: N transfers, N private copies in DRAM)
  staged  the node fetches it once into attuned (`curl | attune stage in -`), each
          instance maps that copy (`attune run --staged in`)
  local   the node fetches it once to a file on local disk, each instance maps the file
          (the sbcast way: one copy, in the page cache, counted to no one)

With --image the input is a container image instead: a SquashFS image (busybox and the
input as /etc/input.dat) that each instance runs in Charliecloud (`ch-run IMAGE --
md5sum /etc/input.dat`, ch-run mounting it with its own SquashFUSE): fetched to a file of
its own per instance, staged once (each instance runs `ch-run "$ATTUNE_STAGED_IMG"`), or
fetched once to a local file.

The time is the makespan: from the first start (the staging or the local fetch included)
to the last instance's end. The memory is the peak of the instances' memory cgroup (with
the staged copy, charged to attuned, added). Needs root, bwrap optional (--image: ch-run,
mksquashfs and busybox, from scripts/setup.sh).

Usage: python3 bench/staging.py [--reps 3] [--counts 10,50,100] [--mib 16] [--rate 2gbit]
                                [--image]
"""
import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
ATTUNE = BUILD / "bin" / "attune"
ATTUNED = BUILD / "bin" / "attuned"
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(ROOT / "bench"))
import imme  # noqa: E402
from test_remote import Hosts, sh  # noqa: E402

MIB = 1 << 20
PORT = 18080
CGROUP = Path("/sys/fs/cgroup/memory")


def container():
    """The container each instance runs in: the node's own root, read-only, in its own
    PID namespace (bubblewrap), or none."""
    b = shutil.which("bwrap")
    if not b:
        return ""
    return f"{b} --ro-bind / / --dev /dev --proc /proc --unshare-pid --die-with-parent"


def commands(variant, url, work, image, reader, cont):
    """What the node runs first, and what each instance runs. With `image` each instance
    runs the image in Charliecloud and checks the input inside it; otherwise it reads the
    input with `reader` in `cont`."""
    if image:
        check = "-- /bin/md5sum /etc/input.dat"
        name, local = "img", f"{work}/local.sqfs"
        fetch = f"curl -sf {url} -o {work}/img.$i && ch-run {work}/img.$i {check}; rm -f {work}/img.$i"
        staged = f"ch-run \"$ATTUNE_STAGED_IMG\" {check}"
        on_local = f"ch-run {local} {check}"
    else:
        name, local = "in", f"{work}/local.dat"
        fetch = f"curl -sf {url} | {cont} {reader} -"
        staged = f"{cont} {reader} \"$ATTUNE_STAGED_IN\""
        on_local = f"{cont} {reader} {local}"
    return {
        "fetch": ("", fetch),
        "staged": (f"curl -sf {url} | {ATTUNE} stage {name} - > /dev/null || exit 1",
                   f"{ATTUNE} run -q --staged {name} -- sh -c '{staged}'"),
        "local": (f"curl -sf {url} -o {local} || exit 1", on_local),
    }[variant]


def script(variant, n, url, work, image, reader, cont):
    first, inst = commands(variant, url, work, image, reader, cont)
    return (f"{first}\nfor i in $(seq {n}); do ({inst}) > {work}/out.$i 2>&1 & done\nwait\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--counts", default="10,50,100")
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--rate", default="2gbit", help="the store's link (tbf)")
    ap.add_argument("--image", action="store_true", help="a SquashFS image run by ch-run")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("staging.py: needs root (network namespaces, a memory cgroup; --image: /dev/fuse)")
    if a.image:
        missing = [t for t in ("ch-run", "mksquashfs", "busybox") if not shutil.which(t)]
        if missing:
            sys.exit(f"staging.py --image: {', '.join(missing)} not installed (scripts/setup.sh)")
    counts = [int(c) for c in a.counts.split(",")]
    work = Path(tempfile.mkdtemp(prefix="attune-staging-"))
    os.chmod(work, 0o755)
    reader = work / "stage_reader"
    subprocess.run(["gcc", "-O2", "-o", reader, ROOT / "bench" / "stage_reader.c"], check=True)
    store = work / "store"
    store.mkdir()
    data = os.urandom(a.mib * MIB)
    if a.image:
        from test_stage import squashfs_image  # noqa: E402
        squashfs_image(work, data).rename(store / "input.dat")
        want = f"{hashlib.md5(data).hexdigest()}  /etc/input.dat"
    else:
        (store / "input.dat").write_bytes(data)
        want = subprocess.run([reader, store / "input.dat"], capture_output=True, text=True).stdout.strip()
    staged_bytes = (store / "input.dat").stat().st_size
    cg = CGROUP / f"attune-stagebench-{os.getpid()}"
    cg.mkdir()
    h = Hosts(1)
    daemon = None
    try:
        srv = h.servers[0]
        sh("ip", "netns", "exec", srv, "tc", "qdisc", "replace", "dev", h.links[srv], "root", "tbf", "rate", a.rate,
           "burst", "256kbit", "latency", "50ms")
        web = subprocess.Popen(["ip", "netns", "exec", srv, "python3", "-m", "http.server", str(PORT), "--bind",
                                "127.77.0.2", "--directory", str(store)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        h.procs.append(web)
        sock = work / "attuned.sock"
        daemon = subprocess.Popen([ATTUNED, "--socket", sock, "--metrics", "off", "--dram", "4G",
                                   "--shared-max", "1G"], stdout=open(work / "attuned.log", "w"),
                                  stderr=subprocess.STDOUT)
        url = f"http://127.77.0.2:{PORT}/input.dat"
        for _ in range(100):
            ok = subprocess.run(h.on_client(["curl", "-sf", "-o", "/dev/null", url])).returncode == 0
            if ok and sock.exists():
                break
            time.sleep(0.1)
        env = dict(os.environ, ATTUNE_SOCKET=str(sock), USER="root")
        cont = container()
        variants = ["fetch", "staged", "local"]
        res = {}
        for rep in range(a.reps):
            for n in counts:
                for v in variants:
                    (cg / "memory.max_usage_in_bytes").write_text("0")
                    body = script(v, n, url, work, a.image, reader, cont)
                    t0 = time.monotonic()
                    r = subprocess.run(["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh",
                                        *h.on_client(["sh", "-c", body])], env=env, capture_output=True,
                                       text=True)
                    dt = time.monotonic() - t0
                    peak = int((cg / "memory.max_usage_in_bytes").read_text())
                    outs = [(work / f"out.{i}").read_text().strip() for i in range(1, n + 1)]
                    bad = [o for o in outs if o != want]
                    if r.returncode != 0 or bad:
                        sys.exit(f"{v} x{n} failed (rc {r.returncode}): {r.stderr[-400:]} "
                                 f"{len(bad)} wrong: {bad[:2]} (want {want})")
                    if v == "staged":
                        peak += staged_bytes
                        subprocess.run([ATTUNE, "unstage", "img" if a.image else "in"], env=env, check=True)
                    if v == "local":
                        (work / ("local.sqfs" if a.image else "local.dat")).unlink()
                    res.setdefault((n, v), []).append((dt, peak))
                    print(f"rep {rep + 1} n={n:4d} {v:7s} {dt:7.2f} s  peak {peak / MIB:8.1f} MiB",
                          file=sys.stderr)
        what = (f"running a {staged_bytes / MIB:.1f} MiB SquashFS image in Charliecloud and reading its "
                f"{a.mib} MiB input" if a.image else f"reading a {a.mib} MiB input")
        where = "Charliecloud" if a.image else "bubblewrap containers" if cont else "no container"
        print(f"\nCold start of N instances each {what} from a store behind a "
              f"{a.rate} link; {where}; medians of "
              f"{a.reps} (min-max); every instance's checksum verified.\n")
        print("| instances | variant | makespan (s) | vs fetch | node memory peak (MiB) |")
        print("|---|---|---|---|---|")
        for n in counts:
            base = statistics.median(t for t, _ in res[(n, "fetch")])
            for v in variants:
                ts = [t for t, _ in res[(n, v)]]
                m = statistics.median(ts)
                mem = statistics.median(p for _, p in res[(n, v)]) / MIB
                print(f"| {n} | {v} | {m:.2f} ({min(ts):.2f}-{max(ts):.2f}) | {base / m:.1f}x | {mem:.0f} |")
    finally:
        if daemon:
            daemon.terminate()
            daemon.wait()
        h.close()
        imme.remove_cgroup(cg)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
