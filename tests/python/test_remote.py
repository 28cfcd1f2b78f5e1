"""The remote tier for real (docs/design/remote.md): `attune memserver` on other hosts,
which are network namespaces joined to the client's by veth pairs on 127.77.0.x addresses through a bridge
(../shared/notes/multi-host.md), over libfabric's tcp provider. Pages at 3x the DRAM
budget verify over 1, 2 and 4 servers; a wrong secret is refused; a killed server or a
cut link makes the program fail with SIGBUS and a message naming the server, never read
other data; a dead runtime's session is dropped at the end of its lease; a user who is
not root runs through it; `attune run` serves an unmodified program from it, and 50 of
them at once through one server.

Needs root (namespaces) and the staged build (make build)."""
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test_daemon import BUILD, MIB, ROOT, workdir  # noqa: F401
from test_pool import build, build_plain

ATTUNE = BUILD / "bin" / "attune"
PORT = 7700

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces"),
    pytest.mark.skipif(not ATTUNE.exists(), reason="make build first"),
]


def sh(*argv):
    subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True)


class Hosts:
    """One client host and n server hosts on one Ethernet segment: each host's veth is
    plugged into a bridge in a switch namespace. Client 127.77.0.1, server i at
    127.77.0.<i+2> (one interface per host, as on a cluster's fabric)."""

    def __init__(self, n):
        tag = f"{os.getpid() % 100000}"
        self.switch = f"atrw{tag}"
        self.client = f"atrc{tag}"
        self.servers = [f"atrs{tag}x{i}" for i in range(1, n + 1)]
        self.procs = []
        self.links = {}
        sh("ip", "netns", "add", self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate([self.client, *self.servers], 1):
            a, b = f"atr{tag}h{i}", f"atr{tag}p{i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            sh("ip", "link", "set", a, "netns", ns)
            sh("ip", "link", "set", b, "netns", self.switch)
            sh("ip", "-n", self.switch, "link", "set", b, "master", "br0")
            sh("ip", "-n", self.switch, "link", "set", b, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "link", "set", a, "up")
            # 127.x on a wire (a per-namespace setting, not the host's).
            sh("ip", "netns", "exec", ns, "sh", "-c", f"echo 1 > /proc/sys/net/ipv4/conf/all/route_localnet && "
               f"echo 1 > /proc/sys/net/ipv4/conf/{a}/route_localnet")
            sh("ip", "-n", ns, "addr", "add", f"127.77.0.{i}/32", "dev", a)
            sh("ip", "-n", ns, "route", "add", "127.77.0.0/24", "dev", a)
            self.links[ns] = a

    def cut(self, i):
        """Cuts server i's link (a partition)."""
        s = self.servers[i]
        sh("ip", "-n", s, "link", "set", self.links[s], "down")

    def addr(self, i):
        return f"127.77.0.{i + 2}:{PORT}"

    def serve(self, i, workdir, secret, *extra, user=None):
        """Starts `attune memserver` on server host i (as `user` if given); returns
        (process, log path)."""
        log = workdir / f"memserver-{self.servers[i]}.log"
        who = ["runuser", "-u", user, "--"] if user else []
        p = subprocess.Popen(["ip", "netns", "exec", self.servers[i], *who, ATTUNE, "memserver", "--listen",
                              self.addr(i), "--secret-file", secret, *map(str, extra)],
                             stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        self.procs.append(p)
        deadline = time.time() + 20
        while "serving" not in log.read_text():
            assert p.poll() is None and time.time() < deadline, log.read_text()
            time.sleep(0.05)
        return p, log

    def on_client(self, argv):
        return ["ip", "netns", "exec", self.client, *map(str, argv)]

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        # What still runs in the hosts (a server started through runuser outlives the
        # runuser killed above): every process of each namespace, by PID.
        for ns in [self.client, *self.servers]:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for ns in [self.client, *self.servers, self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def hosts():
    made = []

    def make(n):
        h = Hosts(n)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def secret(workdir, name="secret"):
    p = workdir / name
    if not p.exists():
        sh(ATTUNE, "memserver", "--new-secret", p)
    return p


def config(workdir, h, n, secret_file, timeout_ms=3000, name="remote", file_dir=None, replicas=1, first=0,
           provider="tcp", rehome_ms=10000):
    p = workdir / f"{name}-{n}.toml"
    p.write_text(f"""
[[tier]]
name = "remote"
kind = "remote"
capacity = "512M"
servers = "{','.join(h.addr(i) for i in range(first, first + n))}"
secret_file = "{secret_file}"
timeout_ms = {timeout_ms}
replicas = {replicas}
provider = "{provider}"
rehome_ms = {rehome_ms}

[[tier]]
name = "file"
kind = "file"
path = "{file_dir or workdir}"
capacity = "256M"
""")
    os.chmod(p, 0o644)
    return p


def stored_mib(log):
    """MiB a server received in stores, from its session lines."""
    return sum(int(m) for m in re.findall(r"(\d+) MiB stored", log.read_text()))


@pytest.mark.parametrize("n", [1, 2, 4])
def test_integrity_at_three_times_the_budget_over_servers(workdir, hosts, n):
    """48 MiB through 16 MiB of DRAM: every word verifies in every pass, and every
    server received pages (units are spread by hash). A quarter of the program's random
    reads (50000, each a remote fault of about 25 us): the passes over every word are
    unchanged."""
    h = hosts(n)
    s = secret(workdir)
    logs = [h.serve(i, workdir, s, "--size", "256M", "--lease", "2")[1] for i in range(n)]
    p = subprocess.run(h.on_client([build(workdir, "integrity"), "48"]), capture_output=True, text=True,
                       timeout=300, env={**os.environ, "ATTUNE_CONFIG": str(config(workdir, h, n, s)),
                                         "ATTUNE_DRAM": "16M", "TEST_BUDGET": str(16 * MIB),
                                         "INTEGRITY_READS": "50000"})
    assert p.returncode == 0 and "FAIL" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert "left out" not in p.stderr, p.stderr
    m = re.search(r"fetched (\d+) MiB", p.stdout)
    assert m and int(m.group(1)) >= 48, p.stdout
    # The runtime is gone: each session ends at its lease and says what it received.
    for log in logs:
        deadline = time.time() + 15
        while "expired" not in log.read_text() and time.time() < deadline:
            time.sleep(0.2)
        assert stored_mib(log) > 0, log.read_text()


@pytest.mark.parametrize("mode,user", [("signal", None), ("thread", None), ("signal", "nobody")])
def test_windows_fetched_ahead_made_stale_by_stores_are_dropped(workdir, hosts, mode, user):
    """tests/c/ahead.c through one server at an 8 MiB budget, in each fault delivery: a
    stream's windows fetched ahead (`ahead`, docs/design/remote.md "Windows fetched
    ahead") are overlapped by stores of pages the program wrote inside them. Every word
    reads back as last written; the tier says at exit that it placed pages from windows,
    dropped stale ones, and found none stale by the content hashes alone (the I/O
    thread's marking, not the hash check, keeps old pages out). With that marking
    broken (`ATTUNE_INJECT=window-unmarked`), the hashes find the stale windows and
    their runs are loaded again from the server: every word still verifies. With
    `ahead = 0` nothing is fetched ahead and every word still verifies. As root and,
    server and program, as nobody (user-mode userfaultfd)."""
    h = hosts(1)
    s, scratch = secret_and_scratch(workdir, user)
    h.serve(0, workdir, s, "--size", "256M", user=user)
    cfg = config(workdir, h, 1, s, name=f"ahead-{mode}-{user}", file_dir=scratch)
    who = ["runuser", "-u", user, "--"] if user else []
    for depth, inject in ((2, None), (2, "window-unmarked"), (0, None)):
        p = subprocess.run(h.on_client([*who, build(workdir, "ahead"), "32"]), capture_output=True, text=True,
                           timeout=300, env={**os.environ, "ATTUNE_CONFIG": str(cfg), "ATTUNE_DRAM": "8M",
                                             "TEST_BUDGET": str(8 * MIB), "ATTUNE_LOG": "info",
                                             "ATTUNE_FAULT_MODE": mode, "ATTUNE_TIER_REMOTE_AHEAD": str(depth),
                                             **({"ATTUNE_INJECT": inject} if inject else {})})
        assert p.returncode == 0 and "FAIL" not in p.stdout + p.stderr, p.stdout + p.stderr[-3000:]
        assert unexpected_warnings(p.stderr) == [], p.stderr[-3000:]
        m = re.search(r"(\d+) KiB fetched ahead, (\d+) KiB of it placed, (\d+) window\(s\) dropped as stale, "
                      r"(\d+) did not match", p.stderr)
        assert m, p.stderr[-3000:]
        fetched, placed, stale, mismatched = map(int, m.groups())
        if depth == 0:
            assert fetched == 0 and placed == 0, m.group(0)
        elif inject:
            # Nothing is marked: the hashes alone keep the old pages out (without the
            # fallback that loads their runs again, words would read old values: FAIL).
            assert placed >= 32 << 10 and mismatched >= 1, m.group(0)
        else:
            assert placed >= 32 << 10 and stale >= 1 and mismatched == 0, m.group(0)


@pytest.mark.parametrize("mode,user", [("signal", None), ("thread", None), ("signal", "nobody")])
def test_a_freed_regions_offsets_given_to_the_next_keep_its_contents(workdir, hosts, mode, user):
    """tests/c/reuse.c through one server at a 4 MiB budget: 40 regions of 16 MiB, each
    filled, read back and freed, the next one given the freed offsets at once. The
    tier discards a freed region without waiting, so the next region's stores follow
    that discard to the same offsets; the server must apply them in that order
    (`Shared::in_order`), or it drops the new pages while the tier takes them for held
    and reads zeros back. Every word verifies."""
    h = hosts(1)
    s, scratch = secret_and_scratch(workdir, user)
    h.serve(0, workdir, s, "--size", "256M", user=user)
    cfg = config(workdir, h, 1, s, name=f"reuse-{mode}-{user}", file_dir=scratch)
    who = ["runuser", "-u", user, "--"] if user else []
    p = subprocess.run(h.on_client([*who, build(workdir, "reuse"), "16", "40"]), capture_output=True, text=True,
                       timeout=300, env={**os.environ, "ATTUNE_CONFIG": str(cfg), "ATTUNE_DRAM": "4M",
                                         "ATTUNE_FAULT_MODE": mode})
    assert p.returncode == 0 and "reuse: 40 rounds" in p.stdout, p.stdout + p.stderr[-3000:]
    assert unexpected_warnings(p.stderr) == [], p.stderr[-3000:]


@pytest.mark.parametrize("mode,user", [("signal", None), ("thread", "nobody")])
def test_a_discard_sent_again_keeps_the_store_that_followed_it(workdir, hosts, mode, user):
    """The resend's order, end to end: tests/c/reuse.c as above, pausing 60 ms after each
    free so that the evictor returns the freed offsets and the next region takes them,
    under `ATTUNE_INJECT=discard-reply-lost`: the I/O thread holds each discard until a
    store to its offsets is posted, sends both in one exchange, and takes the discard's
    answered reply for a broken connection. The tier moves to a new endpoint and sends the
    discard again with every later request to that server (`resent`), so the store is
    applied after it once more. Every word verifies, and the injection fired in most
    rounds (39 of 40 when written). With the discard sent again alone (by hand, in
    `resent`), the next region's first read got SIGBUS: its page did not match its
    checksum."""
    h = hosts(1)
    s, scratch = secret_and_scratch(workdir, user)
    h.serve(0, workdir, s, "--size", "256M", user=user)
    cfg = config(workdir, h, 1, s, name=f"reuse-lost-{mode}-{user}", file_dir=scratch)
    who = ["runuser", "-u", user, "--"] if user else []
    p = subprocess.run(h.on_client([*who, build(workdir, "reuse"), "16", "40", "60"]), capture_output=True,
                       text=True, timeout=300, env={**os.environ, "ATTUNE_CONFIG": str(cfg), "ATTUNE_DRAM": "4M",
                                                    "ATTUNE_FAULT_MODE": mode, "ATTUNE_LOG": "info",
                                                    "ATTUNE_INJECT": "discard-reply-lost"})
    assert p.returncode == 0 and "reuse: 40 rounds" in p.stdout, p.stdout + p.stderr[-3000:]
    assert unexpected_warnings(p.stderr) == [], p.stderr[-3000:]
    fired = p.stderr.count("a discard's reply taken for a broken connection")
    moved = p.stderr.count("moved to a new endpoint (1 session(s) taken over)")
    assert fired >= 20 and moved >= fired, (fired, moved, p.stderr[-3000:])


@pytest.mark.parametrize("concurrency,user", [(1, None), (64, None), (64, "nobody")])
def test_many_faulting_threads_at_the_tiers_concurrency(workdir, hosts, concurrency, user):
    """48 threads reading and writing random words of 32 MiB through 16 MiB of DRAM, one
    server, signal delivery (each thread's fault is its own load; a handler thread
    serves one fault at a time): every word verifies, and the I/O thread says at exit
    how many jobs it found posted at once: one with `concurrency = 1` (each load and
    store waits for the one before), more than the old fixed 8 with 64; as root and,
    server and runtime, as nobody (user-mode userfaultfd)."""
    h = hosts(1)
    s, scratch = secret_and_scratch(workdir, user)
    h.serve(0, workdir, s, "--size", "256M", user=user)
    cfg = config(workdir, h, 1, s, name=f"cc-{user}", file_dir=scratch)
    who = ["runuser", "-u", user, "--"] if user else []
    p = subprocess.run(h.on_client([*who, build(workdir, "stress"), "32"]), capture_output=True, text=True,
                       timeout=300,
                       env={**os.environ, "ATTUNE_CONFIG": str(cfg), "ATTUNE_DRAM": "16M", "ATTUNE_LOG": "info",
                            "ATTUNE_TIER_REMOTE_CONCURRENCY": str(concurrency), "ATTUNE_FAULT_MODE": "signal",
                            "STRESS_THREADS": "48", "STRESS_ITERS": "2000"})
    assert p.returncode == 0 and "FAIL" not in p.stdout + p.stderr, p.stdout + p.stderr[-3000:]
    assert unexpected_warnings(p.stderr) == [], p.stderr[-3000:]
    m = re.search(r"at most (\d+) of its (\d+) jobs were in flight at once", p.stderr)
    assert m and int(m.group(2)) == concurrency, p.stderr[-3000:]
    if concurrency == 1:
        assert int(m.group(1)) == 1, m.group(0)
    else:
        assert int(m.group(1)) > 8, m.group(0)


def test_only_the_pages_that_changed_go_to_the_servers(workdir, hosts):
    """tests/c/writeback.c through two servers: runs of up to 2 MiB go out in pieces, four
    in flight (`Shared::post_each`). Every word verifies through the servers; at least 90%
    of a region with one word changed in every 64th page is not sent again; and the
    servers receive at least 25 MiB less than with one piece per run (`writeback_gap =
    512`, under which the test's 90% check fails and nothing else does)."""
    h = hosts(4)
    s = secret(workdir)
    received = {}
    for gap, first in ((8, 0), (512, 2)):
        logs = [h.serve(i, workdir, s, "--size", "256M", "--lease", "2")[1] for i in (first, first + 1)]
        cfg = config(workdir, h, 2, s, name=f"gap{gap}", first=first)
        p = subprocess.run(h.on_client([build(workdir, "writeback")]), capture_output=True, text=True,
                           timeout=300, env={**os.environ, "ATTUNE_CONFIG": str(cfg), "ATTUNE_DRAM": "16M",
                                             "ATTUNE_WRITEBACK_GAP": str(gap)})
        fails = [line for line in p.stderr.splitlines() if line.startswith("FAIL")]
        if gap == 8:
            assert p.returncode == 0 and not fails, p.stdout + p.stderr
        else:
            assert len(fails) == 1 and "sparse:" in fails[0], p.stdout + p.stderr
        assert "left out" not in p.stderr, p.stderr
        for log in logs:
            deadline = time.time() + 15
            while "expired" not in log.read_text() and time.time() < deadline:
                time.sleep(0.2)
        received[gap] = sum(stored_mib(log) for log in logs)
    print("servers received (MiB) by writeback_gap:", received)
    assert received[512] - received[8] >= 25, received


def test_filled_chunks_are_not_sent_to_the_servers(workdir, hosts):
    """tests/run/fills.c (three arrays of one repeated word each, one of random data, a
    fill that becomes data, a forked child) through one server, with fills and without:
    every word verifies both ways, and with fills the server receives at least 48 MiB
    less: the fills stay words in the runtime (docs/design/paging.md, "Filled chunks")."""
    h = hosts(2)
    s = secret(workdir)
    received = {}
    for fills, at in (("true", 0), ("false", 1)):
        log = h.serve(at, workdir, s, "--size", "512M", "--lease", "2")[1]
        cfg = config(workdir, h, 1, s, name=f"fills-{fills}", first=at)
        p = subprocess.run(h.on_client([ATTUNE, "run", "--dram", "24M", "--config", cfg, "--",
                                        build_plain(workdir, "fills"), "32"]),
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "ATTUNE_FILLS": fills})
        assert p.returncode == 0 and "fills: OK" in p.stdout, p.stdout + p.stderr
        assert ("filled chunks:" in p.stderr) == (fills == "true"), p.stderr
        # Two sessions end: the program's and its forked child's (counted apart).
        deadline = time.time() + 20
        while log.read_text().count("expired") < 2 and time.time() < deadline:
            time.sleep(0.2)
        received[fills] = stored_mib(log)
    print("server received (MiB) with fills and without:", received)
    assert received["false"] - received["true"] >= 48, received


@pytest.mark.parametrize("mode,user", [("signal", None), ("thread", None), ("signal", "nobody")])
def test_pages_the_program_discarded_itself_go_to_the_servers_as_zeros(workdir, hosts, mode, user):
    """tests/run/raw_madvise.c (`madvise(MADV_DONTNEED)` made without libc, ranges that end
    inside 64 KiB chunks) through one server: a chunk whose edge pages the kernel dropped is
    staged with holes, which `tier::store_staged` maps as zeros before the provider's send
    reads the run (a hole there failed the whole connection with EFAULT). Every word reads
    zero where discarded and the round's pattern elsewhere; also as nobody, server and
    program (user-mode userfaultfd)."""
    h = hosts(1)
    s, scratch = secret_and_scratch(workdir, user)
    h.serve(0, workdir, s, "--size", "256M", user=user)
    cfg = config(workdir, h, 1, s, name=f"raw-madvise-{mode}-{user}", file_dir=scratch)
    prog = build_plain(workdir, "raw_madvise")
    who = ["runuser", "-u", user, "--"] if user else []
    for args in (["64", "1", "3"], ["64", "1", "2", "free"]):
        p = subprocess.run(h.on_client([*who, ATTUNE, "run", "-q", "--chunk", "64K", "--fault-mode", mode,
                                        "--dram", "16M", "--config", cfg, "--", prog, *args]),
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0 and "raw_madvise: OK 1 threads" in p.stdout, p.stdout + p.stderr


def test_a_wrong_secret_is_refused_and_the_job_runs_on_its_other_tiers(workdir, hosts):
    h = hosts(1)
    _, log = h.serve(0, workdir, secret(workdir), "--size", "64M")
    other = secret(workdir, "other-job")
    p = subprocess.run(h.on_client([build(workdir, "integrity"), "24"]), capture_output=True, text=True,
                       timeout=300, env={**os.environ, "ATTUNE_CONFIG": str(config(workdir, h, 1, other, name="o")),
                                         "ATTUNE_DRAM": "8M", "TEST_BUDGET": str(8 * MIB)})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "refused the job's secret" in p.stderr and h.addr(0) in p.stderr, p.stderr
    assert "refused a client: wrong secret" in log.read_text()
    assert "session" not in log.read_text()


def test_a_secret_file_others_can_read_is_refused(workdir, hosts):
    loose = workdir / "loose-secret"
    loose.write_text("0123456789abcdef0123456789abcdef\n")
    os.chmod(loose, 0o644)
    p = subprocess.run([ATTUNE, "memserver", "--listen", "127.0.0.1:7799", "--secret-file", loose],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "chmod 600" in p.stderr, p.stderr


@pytest.mark.parametrize("how", ["kill", "link-down"])
def test_a_lost_server_fails_the_program_loudly(workdir, hosts, how):
    """With the pages' only server killed (or its link cut), the program's next read of
    one of them ends it with SIGBUS and a message naming the server; it never reads
    other data (one copy of each page: `replicas = 1`)."""
    h = hosts(1)
    srv, _ = h.serve(0, workdir, secret(workdir), "--size", "256M")
    prog = build(workdir, "remote_lost")
    p = subprocess.Popen(h.on_client([prog, "48"]), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "ATTUNE_CONFIG": str(config(workdir, h, 1, secret(workdir),
                                                                         timeout_ms=1000)),
                              "ATTUNE_DRAM": "16M"})
    assert p.stdout.readline().strip() == "remote_lost: ready", p.stderr.read()
    if how == "kill":
        srv.kill()
        srv.wait()
    else:
        h.cut(0)
    out, err = p.communicate("r\n", timeout=120)
    assert "WRONG DATA" not in out, out
    assert p.returncode == -signal.SIGBUS, (p.returncode, out, err)
    assert h.addr(0) in err and "no answer" in err, err


def test_a_restarted_server_fails_the_program_loudly(workdir, hosts):
    """The pages' only server restarted under the program (SIGKILL, then a new one on
    the same address, empty): its requests go unanswered (the new server knows no such
    session), the runtime moves to a new endpoint and asks for its session there, the
    server refuses, and the next read of a page it held ends the program with SIGBUS and
    a message naming the server; never other data."""
    h = hosts(1)
    srv, _ = h.serve(0, workdir, secret(workdir), "--size", "256M")
    p = Program(h, workdir, config(workdir, h, 1, secret(workdir), timeout_ms=5000, name="restart")).p
    srv.kill()
    srv.wait()
    _, log = h.serve(0, workdir, secret(workdir), "--size", "256M")
    out, err = p.communicate("r\n", timeout=120)
    assert "WRONG DATA" not in out, out
    assert p.returncode == -signal.SIGBUS, (p.returncode, out, err)
    assert h.addr(0) in err and "no longer holds the session" in err, err
    assert "refused a client: unknown session or token in a hello" in log.read_text(), log.read_text()


def test_a_dead_runtime_loses_its_session_at_the_end_of_its_lease(workdir, hosts):
    h = hosts(1)
    _, log = h.serve(0, workdir, secret(workdir), "--size", "256M", "--lease", "2")
    p = subprocess.Popen(h.on_client([build(workdir, "remote_lost"), "48"]), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "ATTUNE_CONFIG": str(config(workdir, h, 1, secret(workdir))),
                              "ATTUNE_DRAM": "16M"})
    assert p.stdout.readline().strip() == "remote_lost: ready"
    held = re.compile(r"session \d+ expired .*: (\d+) MiB freed")
    time.sleep(3)
    assert not held.search(log.read_text()), "a live runtime's pings keep its lease"
    p.kill()
    p.wait()
    deadline = time.time() + 15
    while not held.search(log.read_text()) and time.time() < deadline:
        time.sleep(0.2)
    m = held.search(log.read_text())
    assert m and int(m.group(1)) >= 24, log.read_text()


@pytest.mark.parametrize("user", [None, "nobody"])
def test_an_exiting_runtime_frees_its_pages_soon_and_still_reads_them(workdir, hosts, user):
    """An unmodified program under `attune run` (64 MiB through 16 MiB of DRAM, two
    servers, two copies) reads its whole array back from an atexit handler it registered
    first, 3 s into its exit. The runtime's own exit handler ran before it and told each
    server that the process is exiting: the servers free its pages 2 s (twice the 1 s
    timeout) after its last request instead of at the end of the 60 s lease, while the
    pings every 0.5 s keep them through the 3 s of exit and every word verifies. As root
    and, servers and runtime, as nobody."""
    h = hosts(2)
    s, scratch = secret_and_scratch(workdir, user)
    logs = [h.serve(i, workdir, s, "--size", "256M", "--lease", "60", user=user)[1] for i in range(2)]
    cfg = config(workdir, h, 2, s, timeout_ms=1000, name=f"exit-{user}", file_dir=scratch, replicas=2)
    who = ["runuser", "-u", user, "--"] if user else []
    p = subprocess.run(h.on_client([*who, ATTUNE, "run", "--dram", "16M", "--config", cfg, "--",
                                    build_plain(workdir, "exit_reads"), "64", "3000"]),
                       capture_output=True, text=True, timeout=120, env={**os.environ, "ATTUNE_LOG": "info"})
    ended = time.time()
    assert p.returncode == 0 and "exit_reads: OK" in p.stdout, p.stdout + p.stderr
    assert not unexpected_warnings(p.stderr), p.stderr
    assert "2 of 2 server(s) free this process's pages 2000 ms after its last request" in p.stderr, p.stderr
    freed = re.compile(r"session \d+ expired .*: (\d+) MiB freed")
    for log in logs:
        while not freed.search(log.read_text()) and time.time() < ended + 15:
            time.sleep(0.1)
        text = log.read_text()
        # Expiry is checked each second: about 3 s after the last request (2 s + 1 s),
        # which was before the program ended; 60 s without the bye. Asserted with room
        # for a loaded host.
        print(f"pages freed {time.time() - ended:.1f} s after the program ended")
        assert time.time() - ended < 8, text
        assert "its runtime is exiting" in text, text
        m = freed.search(text)
        assert m and int(m.group(1)) >= 40, text


def test_a_stopped_server_holds_the_exit_up_briefly_and_loses_nothing(workdir, hosts):
    """The same program, but the first server is stopped (SIGSTOP) just before the
    program returns from main: the bye to it goes unanswered (it is best effort: the
    exit does not wait for it beyond a bound), the handler's reads then find the server
    silent, lose it and read every word from the other copy, and the other server still
    frees the pages soon after the program's end.

    The last evictions' write-out may still be in flight when the program says
    "written"; the test waits 0.5 s before the stop so that it usually meets an idle
    runtime. If a write-out to the stopped server was still outstanding, the runtime
    rightly loses that server during the linger, before the exit (one CI run in about
    ten did): then the bye goes to the one live server, which is as correct."""
    h = hosts(2)
    s = secret(workdir)
    srv = [h.serve(i, workdir, s, "--size", "256M", "--lease", "60") for i in range(2)]
    cfg = config(workdir, h, 2, s, timeout_ms=1000, name="exit-stopped", replicas=2)
    p = subprocess.Popen(h.on_client([ATTUNE, "run", "--dram", "16M", "--config", cfg, "--",
                                      build_plain(workdir, "exit_reads"), "64", "0", "2000"]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "ATTUNE_LOG": "info"})
    try:
        assert p.stdout.readline().strip() == "exit_reads: written"
        time.sleep(0.5)
        srv[0][0].send_signal(signal.SIGSTOP)
        stopped = time.time()
        out, err = p.communicate(timeout=120)
    finally:
        srv[0][0].send_signal(signal.SIGCONT)
    ended = time.time()
    assert p.returncode == 0 and "exit_reads: OK" in out, out + err
    lost = f"server {h.addr(0)} lost"
    assert lost in err, err
    if "1 of 2 server(s) free this process's pages" not in err:
        # Lost during the linger: the exit told the one server left.
        assert "1 of 1 server(s) free this process's pages" in err, err
        assert err.index(lost) < err.index("remote tier: exiting"), err
    # Held up briefly: the linger, a timeout for the unanswered bye, the reads that lose
    # the server (about a timeout each for the request and its takeover), with slack.
    assert ended - stopped < 1.5 + 4 * 1.0 + 5, (ended - stopped, err)
    freed = re.compile(r"session \d+ expired .*: (\d+) MiB freed")
    log = srv[1][1]
    while not freed.search(log.read_text()) and time.time() < ended + 15:
        time.sleep(0.1)
    assert time.time() - ended < 8 and "its runtime is exiting" in log.read_text(), log.read_text()


def test_a_user_who_is_not_root_runs_through_a_remote_tier(workdir, hosts):
    """The job's secret belongs to the user (mode 0600); the servers and the runtime run
    as that user (user-mode userfaultfd), and `attune run` of an unmodified program
    verifies, forked Python workers included."""
    h = hosts(2)
    s = nobody_secret(workdir)
    for i in range(2):
        h.serve(i, workdir, s, "--size", "256M", user="nobody")
    scratch = workdir / "nobody-scratch"
    scratch.mkdir(exist_ok=True)
    os.chmod(scratch, 0o777)
    cfg = config(workdir, h, 2, s, name="nobody", file_dir=scratch)
    prog = build_plain(workdir, "c_matrix")
    p = subprocess.run(h.on_client(["runuser", "-u", "nobody", "--", ATTUNE, "run", "--dram", "32M",
                                    "--config", cfg, "--", prog, "128"]),
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "ATTUNE_LOG": "info"})
    assert p.returncode == 0 and "c_matrix: OK" in p.stdout, p.stdout + p.stderr
    assert "2 memory server(s)" in p.stderr, p.stderr
    # Forked workers too: the servers clone the user's sessions for them.
    p = subprocess.run(h.on_client(["runuser", "-u", "nobody", "--", ATTUNE, "run", "-q", "--dram", "32M",
                                    "--config", cfg, "--", "python3", ROOT / "tests" / "run" / "mp_fork.py",
                                    "64", "2"]),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "mp_fork: OK" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("n,replicas", [(1, 1), (2, 2)])
def test_a_forked_child_reads_and_writes_its_pages_through_the_servers(workdir, hosts, n, replicas):
    """tests/c/fork_inherit.c with its far pages on memory servers: three children at once,
    a grandchild, forks under concurrent faults. Each child sees its parent's data as it
    was at the fork, and its own writes never reach the parent's pages (each server
    cloned the session for it and shares the pages until one side writes)."""
    h = hosts(n)
    s = secret(workdir)
    logs = [h.serve(i, workdir, s, "--size", "256M")[1] for i in range(n)]
    cfg = config(workdir, h, n, s, name=f"fork{n}", replicas=replicas)
    p = subprocess.run(h.on_client([build(workdir, "fork_inherit")]), capture_output=True, text=True,
                       timeout=300, env={**os.environ, "ATTUNE_CONFIG": str(cfg), "ATTUNE_DRAM": "16M",
                                         "TEST_BUDGET": str(16 * MIB)})
    assert p.returncode == 0 and "fork_inherit: ok" in p.stdout, p.stdout + p.stderr
    assert "not see managed memory" not in p.stderr and "cannot serve" not in p.stderr, p.stderr
    for log in logs:
        text = log.read_text()
        assert text.count("cloned from") >= 3 and "taken over by a forked runtime" in text, text


def test_a_forked_childs_pages_fail_loudly_when_their_server_is_lost(workdir, hosts):
    """The child reads its inherited pages through the session cloned for it; with that
    server killed, its next read ends it with SIGBUS and the server's name, never other
    data (one copy of each page)."""
    h = hosts(1)
    srv, _ = h.serve(0, workdir, secret(workdir), "--size", "256M")
    p = subprocess.Popen(h.on_client([build(workdir, "remote_lost"), "48"]), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "ATTUNE_CONFIG": str(config(workdir, h, 1, secret(workdir),
                                                                         timeout_ms=1000, name="forklost")),
                              "ATTUNE_DRAM": "16M"})
    assert p.stdout.readline().strip() == "remote_lost: ready", p.stderr.read()
    p.stdin.write("f\nr\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "remote_lost: forked", p.stderr.read()
    assert p.stdout.readline().strip() == "remote_lost: read back", p.stderr.read()
    srv.kill()
    srv.wait()
    out, err = p.communicate("r\n", timeout=120)
    assert "WRONG DATA" not in out, out
    assert p.returncode == -signal.SIGBUS, (p.returncode, out, err)
    assert f"server {h.addr(0)} lost" in err, err


def test_forked_python_workers_read_numpy_arrays_from_the_servers(workdir, hosts):
    """An unmodified program: multiprocessing's fork pool over numpy arrays twice the
    budget (tests/run/mp_fork.py), its far pages on a memory server."""
    h = hosts(1)
    s = secret(workdir)
    _, log = h.serve(0, workdir, s, "--size", "512M")
    cfg = config(workdir, h, 1, s, name="mpfork")
    p = subprocess.run(h.on_client([ATTUNE, "run", "-q", "--dram", "32M", "--config", cfg, "--", "python3",
                                    ROOT / "tests" / "run" / "mp_fork.py", "64", "3"]),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "mp_fork: OK" in p.stdout, p.stdout + p.stderr
    assert "forked child" not in p.stderr and "cannot serve" not in p.stderr, p.stderr
    assert "taken over by a forked runtime" in log.read_text(), log.read_text()


def open_sessions(text):
    """The sessions a server's log shows opened (or cloned) and not yet over."""
    opened = set(re.findall(r"session (\d+) (?:opened|cloned)", text))
    return opened - set(re.findall(r"session (\d+) (?:ended|expired|closed)", text))


def test_runtimes_that_end_with_requests_in_flight_do_not_stop_the_server(workdir, hosts):
    """A runtime that frees its far pages and exits at once (its discards still in
    flight), or is SIGKILLed while its pages move, leaves the server replies to a peer
    that is gone. The server goes on serving the next runtime at once, and ends the dead
    runtime's session within its lease (6 s here): a second after a reply to it failed,
    or when its lease runs out if every reply got out before its connection closed (a
    CI run's SIGKILLed runtime had nothing in flight; the provider tells the server
    nothing of a closed connection with no operation on it). (Seen once, not
    reproduced at will: after the benchmark's fault scenario the server died of the
    provider's error, "completion queue: No such file or directory" from the blocking
    read's wait set, and the next runtime's hello went unanswered; such errors are now
    logged and the loop goes on.)"""
    h = hosts(1)
    _, log = h.serve(0, workdir, secret(workdir), "--size", "2G", "--lease", "6")
    env = {**os.environ, "ATTUNE_CONFIG": str(config(workdir, h, 1, secret(workdir))), "ATTUNE_DRAM": "8M",
           "TEST_BUDGET": str(8 * MIB)}
    # The next runtime's check: every word, a tenth of the random reads (the 200000 of
    # the program's default took 11 s of each of the three).
    quick = {**env, "ATTUNE_CONFIG": str(config(workdir, h, 1, secret(workdir), timeout_ms=2000, name="quick")),
             "ATTUNE_DRAM": "4M", "TEST_BUDGET": str(4 * MIB), "INTEGRITY_READS": "20000"}
    for how in ("lab", "free-exit", "kill"):
        if how == "lab":
            # The benchmark's random-fault scenario: 256 MiB on 64 MiB of DRAM, freed at
            # the end; the one that made the server die.
            only = workdir / "remote-only.toml"
            only.write_text(f'[[tier]]\nname = "remote"\nkind = "remote"\ncapacity = "2G"\n'
                            f'servers = "{h.addr(0)}"\nsecret_file = "{secret(workdir)}"\n')
            p = subprocess.run(h.on_client(["env", "ATTUNE_DRAM=64M", "ATTUNE_READAHEAD=0", f"ATTUNE_CONFIG={only}",
                                            BUILD / "bin" / "attune-lab", "__worker", "fault-attune-thread"]),
                               capture_output=True, text=True, timeout=300, env=env)
            assert p.returncode == 0 and '"ok":true' in p.stdout, p.stdout + p.stderr
            # Random updates over 4x the budget, 4 KiB pages stored and discarded apart
            # within 64 KiB units (once lost pages: a unit's copy record cleared by one
            # page's discard; the benchmark's 512 MiB over 256 MiB found it, and took 17 s
            # of this test).
            p = subprocess.run(h.on_client(["env", "ATTUNE_READAHEAD=0", ATTUNE, "run", "-q", "--fault-mode",
                                            "thread", "--config", only, "--dram", "16M", "--",
                                            build_plain(workdir, "rand_update"), "64", "150000"]),
                               capture_output=True, text=True, timeout=300, env=env)
            assert p.returncode == 0 and "rand_update: OK" in p.stdout, p.stdout + p.stderr
        elif how == "kill":
            p = subprocess.Popen(h.on_client([build(workdir, "integrity"), "64"]), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, env=env)
            time.sleep(1.0)
            p.kill()
            p.wait()
        else:
            p = subprocess.run(h.on_client([build(workdir, "remote_lost"), "48", "free-exit"]), capture_output=True,
                               text=True, timeout=120, env=env)
            assert p.returncode == 0, p.stdout + p.stderr
        # The provider notices the dead peer while the server sleeps on its queue.
        time.sleep(1)
        # Every session of the runtimes that are gone ends within its lease: a second
        # after a reply to it failed, or at the lease (checked each second) if none was
        # in flight.
        deadline = time.time() + 6 + 3
        while open_sessions(log.read_text()):
            assert time.time() < deadline, (how, open_sessions(log.read_text()), log.read_text()[-3000:])
            time.sleep(0.2)
        q = subprocess.run(h.on_client([build(workdir, "integrity"), "16"]), capture_output=True, text=True,
                           timeout=120, env=quick)
        assert q.returncode == 0 and "warning" not in q.stderr, how + q.stdout + q.stderr + log.read_text()
    assert "error" not in log.read_text(), log.read_text()


def test_a_runtime_on_the_port_of_a_killed_one_is_answered(workdir, hosts):
    """Runtimes SIGKILLed while their pages move, each followed at once by the next on the
    same port (the provider's port range pinned to one port, as short-lived forked
    children reuse ports): the server ends the killed runtime's session when its reply
    fails or the new hello comes from its address, not at the end of its lease, and the
    next runtime is answered and reads back every value it wrote. (rMap's Figure 7 found
    clients on reused ports unanswered, and numbered from 1 in every runtime, a dead
    runtime's late replies matched the next one's requests.)"""
    h = hosts(1)
    _, log = h.serve(0, workdir, secret(workdir), "--size", "2G", "--lease", "60")
    # libfabric 1.17: FI_NET_* for its net provider (what "tcp" opens), FI_TCP_* for tcp.
    port = {f"FI_{p}_PORT_{e}_RANGE": "7811" for p in ("TCP", "NET") for e in ("LOW", "HIGH")}
    env = {**os.environ, **port, "ATTUNE_CONFIG": str(config(workdir, h, 1, secret(workdir))),
           "ATTUNE_DRAM": "8M", "TEST_BUDGET": str(8 * MIB)}
    for k in range(3):
        p = subprocess.Popen(h.on_client([build(workdir, "integrity"), "64"]), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=env)
        time.sleep(1.0 + 0.3 * k)
        p.kill()
        p.wait()
        q = subprocess.run(h.on_client([build(workdir, "integrity"), "24"]), capture_output=True, text=True,
                           timeout=120, env={**env, "INTEGRITY_READS": "20000"})
        assert q.returncode == 0 and "warning" not in q.stderr, (k, q.stdout + q.stderr + log.read_text())
    text = log.read_text()
    ended = re.findall(r"session (\d+) ended \(([^)]*)\)", text)
    # Each killed runtime's session ended within the test (the lease is 60 s).
    assert len(ended) >= 3, text
    assert "error" not in text, text


def test_fifty_runtimes_at_once_on_one_server(workdir, hosts):
    """50 unmodified programs under `attune run` at once, each 8 MiB through 2 MiB of DRAM
    with random updates checked by their sum, all through one server: every one ends
    correct with no server lost and no tier left out, and the server opened a session
    for each. The 10 s timeout is for this host, where 50 jobs and the server share two
    vCPUs."""
    h = hosts(1)
    _, log = h.serve(0, workdir, secret(workdir), "--size", "2G")
    cfg = config(workdir, h, 1, secret(workdir), timeout_ms=10000)
    exe = build_plain(workdir, "rand_update")
    t0 = time.time()
    procs = [subprocess.Popen(h.on_client([ATTUNE, "run", "-q", "--config", cfg, "--dram", "2M", "--", exe, "8",
                                           "2000"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(50)]
    results = [p.communicate(timeout=600) for p in procs]
    print(f"50 runtimes through one server in {time.time() - t0:.1f} s")
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0 and "rand_update: OK" in out, out + err + log.read_text()[-2000:]
        assert "warning" not in err, err
    text = log.read_text()
    assert len(re.findall(r"session \d+ opened", text)) == 50, text
    assert "error" not in text, text


@pytest.mark.parametrize("provider", ["tcp", pytest.param("tcp;ofi_rxm", marks=pytest.mark.skipif(
    not os.environ.get("TEST_OFI_RXM"), reason="libfabric 1.17's ofi_rxm stalls this cell for 30-40 s "
    "(TEST_OFI_RXM=1 runs it)"))])
def test_eight_runtimes_through_four_servers_keep_their_sessions(workdir, hosts, provider):
    """rMap's Figure 7 cell that stalled: 8 unmodified programs at once under `attune
    run`, each 3 sequential passes over 32 MiB through 8 MiB of DRAM (read-ahead: many
    requests in flight), spread over 4 servers, twice. Every program's sum is the one it
    gives without Attune, no server is lost and no server logs an error. Over libfabric
    1.17's tcp;ofi_rxm, servers could no longer reach live runtimes, ended their sessions
    and dropped hundreds of their requests (3 runs of 3; clients stalled 1-7 s); "tcp"
    now opens the net provider, and a server ends a session only when it sent nothing
    while its replies could not be sent (docs/design/remote.md, "TCP without ofi_rxm").
    The tcp;ofi_rxm case (TEST_OFI_RXM=1) failed before that rule and passes with it,
    in 35-45 s against 5."""
    h = hosts(4)
    logs = [h.serve(i, workdir, secret(workdir), "--size", "1G", "--provider", provider)[1] for i in range(4)]
    cfg = config(workdir, h, 4, secret(workdir), timeout_ms=5000, provider=provider)
    exe = workdir / "unit_patterns"
    sh("gcc", "-O2", "-pthread", ROOT / "bench" / "unit_patterns.c", "-o", exe)
    plain = subprocess.run([exe, "seq", "32"], check=True, capture_output=True, text=True).stdout
    want = plain.split("sum=")[1].strip()
    for _ in range(2):
        procs = [subprocess.Popen(h.on_client([ATTUNE, "run", "-q", "--config", cfg, "--dram", "8M", "--", exe,
                                               "seq", "32"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(8)]
        results = [p.communicate(timeout=300) for p in procs]
        text = "".join(log.read_text() for log in logs)
        for p, (out, err) in zip(procs, results):
            assert p.returncode == 0 and f"sum={want}" in out, out + err + text[-3000:]
            assert "warning" not in err, err + text[-3000:]
        assert "error" not in text, text


# Passes over a test program's pages queued at once where a server is stopped or killed
# "while the program writes": enough that the program is still moving pages when the
# signal lands, on a fast host too.
PASSES = 6


class Program:
    """remote_lost.c on the client host, driven line by line (its stderr to the file `err`
    if given, to be read while it runs)."""

    def __init__(self, h, workdir, cfg, mib=48, dram="16M", user=None, err=None):
        who = ["runuser", "-u", user, "--"] if user else []
        self.p = subprocess.Popen(h.on_client([*who, build(workdir, "remote_lost"), mib]), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=open(err, "w") if err else subprocess.PIPE,
                                  text=True,
                                  env={**os.environ, "ATTUNE_CONFIG": str(cfg), "ATTUNE_DRAM": dram})
        self.expect("ready")

    def expect(self, what):
        line = self.p.stdout.readline().strip()
        assert line == f"remote_lost: {what}", (line, self.finish())

    def say(self, cmd, what):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        self.expect(what)

    def finish(self):
        try:
            out, err = self.p.communicate("q\n", timeout=60)
        except (ValueError, OSError):
            out, err = "", self.p.stderr.read()
        return self.p.returncode, out, err


def nobody_secret(workdir):
    """A job secret that belongs to nobody (mode 0600), for servers and runtimes run as
    nobody."""
    s = workdir / "nobody-secret"
    if not s.exists():
        sh(ATTUNE, "memserver", "--new-secret", s)
        os.chown(s, 65534, 65534)
    return s


def unexpected_warnings(err):
    """The runtime's warnings but its notice of user-mode userfaultfd (the one a runtime
    run as nobody gives)."""
    return [w for w in err.splitlines() if "warning" in w and "user-mode faults only" not in w]


def secret_and_scratch(workdir, user):
    """The job secret and a file tier directory for a runtime run as `user` (None: root)."""
    scratch = workdir / f"scratch-{user}"
    scratch.mkdir(exist_ok=True)
    os.chmod(scratch, 0o777)
    return (nobody_secret(workdir) if user else secret(workdir)), scratch


@pytest.mark.parametrize("user", [None, "nobody"])
def test_a_reset_connection_loses_nothing(workdir, hosts, user):
    """Connections between the runtime and its only server (one copy of each page)
    destroyed under it (`ss -K`, twenty times over a second) while it reads its pages
    back and writes new ones: every word verifies and the program goes on. A reply lost
    with its connection leaves its request unanswered; after 2 s the runtime moves to a
    new endpoint and the server gives it its session there (before, the server was lost
    and the program died of SIGBUS, 3 runs of 3: docs/design/remote.md). As root and,
    server and runtime, as nobody (user-mode userfaultfd)."""
    h = hosts(1)
    s, scratch = secret_and_scratch(workdir, user)
    _, log = h.serve(0, workdir, s, "--size", "256M", user=user)
    cfg = config(workdir, h, 1, s, timeout_ms=5000, name=f"reset-{user}", file_dir=scratch)
    prog = Program(h, workdir, cfg, mib="64", user=user)
    server_ip = h.addr(0).split(":")[0]

    steps = [("r", "read back"), ("w", "written")] * 4 + [("r", "read back")]
    prog.p.stdin.write("".join(c + "\n" for c, _ in steps))
    prog.p.stdin.flush()
    for _ in range(20):
        subprocess.run(h.on_client(["ss", "-K", "dst", server_ip]), capture_output=True)
        time.sleep(0.05)
    for _, what in steps:
        prog.expect(what)
    code, out, err = prog.finish()
    text = log.read_text()
    warnings = unexpected_warnings(err)
    assert code == 0 and not warnings, (code, out, err, text)
    assert "lost" not in err and "error" not in text, (err, text)
    # The path was taken (once in each of 3 runs: some reply was lost with its
    # connection).
    assert "taken over by its runtime from a new endpoint" in text, text


@pytest.mark.parametrize("user", [None, "nobody"])
def test_a_paused_server_loses_nothing(workdir, hosts, user):
    """The only server (one copy of each page) stopped for 2.6 s (less than the 5 s
    timeout) three times, each while the program writes its pages and reads them back:
    each pause leaves requests unanswered past 2 s, the runtime moves to a new endpoint,
    and the server, resumed, has in its queues both the requests sent from the old
    endpoint and those sent again from the new one, read in any order. Every word
    verifies and the server is not lost. A request from the old endpoint carries the
    token from before the takeover and is refused (before, a late store could overwrite
    a page's newer contents, caught by the runtime's checksum as a SIGBUS in CI's remote
    soak). The server keeps the old endpoint's address until its replies there are done
    (removed under them, its number went to the new endpoint, and the server was lost in
    about half the runs: docs/design/remote.md, "Requests from an old endpoint"). The
    runtime as root and as nobody (user-mode userfaultfd); the server as root, so that
    SIGSTOP reaches it rather than a runuser in front of it."""
    h = hosts(1)
    s, scratch = secret_and_scratch(workdir, user)
    srv, log = h.serve(0, workdir, s, "--size", "256M")
    cfg = config(workdir, h, 1, s, timeout_ms=5000, name=f"paused-{user}", file_dir=scratch)
    prog = Program(h, workdir, cfg, mib="64", user=user)
    # One write and read back of 64 MiB takes about 0.2 s here (2026-12-01): six of them
    # queued keep requests in flight when the server stops 0.2 s on. With one, a faster
    # host finished before the stop, and no request waited on the paused server.
    for _ in range(3):
        prog.p.stdin.write("w\nr\n" * PASSES)
        prog.p.stdin.flush()
        time.sleep(0.2)
        srv.send_signal(signal.SIGSTOP)
        time.sleep(2.6)
        srv.send_signal(signal.SIGCONT)
        for _ in range(PASSES):
            prog.expect("written")
            prog.expect("read back")
    code, out, err = prog.finish()
    text = log.read_text()
    warnings = unexpected_warnings(err)
    assert code == 0 and not warnings, (code, out, err, text)
    assert text.count("taken over by its runtime from a new endpoint") >= 2, text


def test_two_copies_survive_a_killed_server_and_it_rejoins(workdir, hosts):
    """Each page on two of three servers. SIGKILL of one: every word still reads back
    (from the other copy) and the program keeps running; the killed server, started
    again, rejoins empty and takes copies of what is written next; then the other two
    next is killed: every word still verifies."""
    h = hosts(3)
    s = secret(workdir)
    srv = [h.serve(i, workdir, s, "--size", "256M")[0] for i in range(3)]
    cfg = config(workdir, h, 3, s, timeout_ms=1000, name="replicated", replicas=2)
    prog = Program(h, workdir, cfg)
    srv[0].kill()
    srv[0].wait()
    prog.say("r", "read back")
    # Started again (same address, empty): it rejoins within the tier's rejoin period.
    logs = h.serve(0, workdir, s, "--size", "256M")[1]
    deadline = time.time() + 20
    while "session" not in logs.read_text() and time.time() < deadline:
        time.sleep(0.2)
    assert "session" in logs.read_text(), "the restarted server was not rejoined"
    prog.say("w", "written")
    # Every page written after the rejoin has two live copies again: losing any one
    # more server loses nothing.
    srv[1].kill()
    srv[1].wait()
    prog.say("r", "read back")
    rc, out, err = prog.finish()
    assert rc == 0 and "WRONG DATA" not in out, (rc, out, err)
    assert h.addr(0) in err and "rejoined" in err and h.addr(1) in err, err


def lose_and_rejoin(workdir, hosts, user, size):
    """Three servers (as root, so that SIGKILL reaches them), two copies of each page,
    and remote_lost.c (as `user`) holding 48 MiB through 16 MiB of DRAM. The first server
    is killed, every word reads back from the other copies, and it is started again
    with `size` bytes. Returns the hosts, the servers, the program and its stderr file,
    once the runtime has said how its pass of copies made again ended (or after 30 s)."""
    h = hosts(3)
    s, scratch = secret_and_scratch(workdir, user)
    srv = [h.serve(i, workdir, s, "--size", "256M")[0] for i in range(3)]
    cfg = config(workdir, h, 3, s, timeout_ms=1000, name=f"rebuilt-{user}-{size}", replicas=2, file_dir=scratch)
    err = workdir / f"rebuilt-{user}-{size}.err"
    prog = Program(h, workdir, cfg, user=user, err=err)
    srv[0].kill()
    srv[0].wait()
    prog.say("r", "read back")
    h.serve(0, workdir, s, "--size", size)
    deadline = time.time() + 30
    while not re.search("copies (made|not made) again", err.read_text()) and time.time() < deadline:
        time.sleep(0.2)
    return h, srv, prog, err


def read_write_read(prog, err):
    """The program reads every word back, writes them anew and reads them back, then
    quits; it must end well with every word verified. Returns its stderr file's text."""
    prog.say("r", "read back")
    prog.say("w", "written")
    prog.say("r", "read back")
    rc, out, _ = prog.finish()
    text = err.read_text()
    assert rc == 0 and "WRONG DATA" not in out, (rc, out, text)
    return text


@pytest.mark.parametrize("user", [None, "nobody"])
def test_copies_are_made_again_when_a_server_rejoins(workdir, hosts, user):
    """A killed server started again rejoins empty, and the runtime makes its copies
    again in the background from the live ones while the program writes nothing. Then a
    second server is killed: every word still verifies, the pages whose other copy was
    on it read from the copies made again (without them, about a third of the pages has
    no copy left and the read ends in SIGBUS: checked by not starting the rebuild). The
    runtime as root and as nobody."""
    h, srv, prog, err = lose_and_rejoin(workdir, hosts, user, "256M")
    srv[1].kill()
    srv[1].wait()
    prog.say("r", "read back")
    rc, out, _ = prog.finish()
    text = err.read_text()
    assert rc == 0 and "WRONG DATA" not in out, (rc, out, text)
    m = re.search(r"copies made again: (\d+) MiB in ([0-9.]+) s", text)
    assert m and int(m.group(1)) >= 8, text
    print(m.group(0))


@pytest.mark.parametrize("user", [None, "nobody"])
def test_a_copy_answered_by_a_server_lost_in_the_same_exchange_is_not_counted(workdir, hosts, user):
    """Two servers, two copies of each page. While the program writes, the first server
    is stopped (its requests go unanswered) and the second, which has answered its
    stores, is killed; 2 s on, the runtime moves to a new endpoint, the first server
    takes its session over when resumed (2.6 s), the second cannot and is lost. The
    stores it answered before dying must not count as copies: started again, it rejoins
    empty, and the pass of copies made again must copy those pages too. Counted, they
    were read from it as zeros: CI's remote soak died of a checksum mismatch (SIGBUS)
    once in its 20 s, and this test in 4 of 5 runs before the fix (client.rs,
    `mark_copy`). The runtime as root and as nobody; the servers as root, so that
    SIGSTOP reaches them."""
    h = hosts(2)
    s, scratch = secret_and_scratch(workdir, user)
    srv = [h.serve(i, workdir, s, "--size", "256M")[0] for i in range(2)]
    cfg = config(workdir, h, 2, s, timeout_ms=5000, name=f"lost-mid-exchange-{user}", replicas=2, file_dir=scratch)
    err = workdir / f"lost-mid-exchange-{user}.err"
    prog = Program(h, workdir, cfg, mib="64", user=user, err=err)
    # Writes queued to outlast the 0.2 s before the stop (one takes about 0.1 s here).
    prog.p.stdin.write("w\n" * PASSES)
    prog.p.stdin.flush()
    time.sleep(0.2)
    srv[0].send_signal(signal.SIGSTOP)
    time.sleep(0.5)
    srv[1].kill()
    srv[1].wait()
    time.sleep(2.1)
    srv[0].send_signal(signal.SIGCONT)
    for _ in range(PASSES):
        prog.expect("written")
    assert f"server {h.addr(1)} lost" in err.read_text(), err.read_text()
    h.serve(1, workdir, s, "--size", "256M")
    deadline = time.time() + 30
    while "copies made again" not in err.read_text() and time.time() < deadline:
        time.sleep(0.2)
    # Every page is read from its first copy: half of them from the rejoined server.
    try:
        prog.say("r", "read back")
    finally:
        print(err.read_text())
    rc, out, _ = prog.finish()
    text = err.read_text()
    assert rc == 0 and "WRONG DATA" not in out, (rc, out, text)
    assert "copies made again:" in text, text


@pytest.mark.parametrize("user", [None, "nobody"])
def test_a_server_gone_for_good_has_its_copies_placed_on_the_others(workdir, hosts, user):
    """Three servers, two copies of each page; the first is killed and not started
    again. After `rehome_ms` (1.5 s here) the runtime gives it up: the copies it held are
    placed on the two others (each unit's copies still on distinct servers) and made
    there from the live copies. The program then forks (the child's sessions cloned, its
    copies where the parent placed them) and the second server is killed: every word
    still verifies in the child, which writes and reads again on the last server. Without
    the new places, the units whose copies were on the first two servers have none left
    and the read ends in SIGBUS; a child that placed its copies where they started
    forgets the moved ones and ends the same way. The runtime as root and as nobody."""
    h = hosts(3)
    s, scratch = secret_and_scratch(workdir, user)
    srv = [h.serve(i, workdir, s, "--size", "256M")[0] for i in range(3)]
    cfg = config(workdir, h, 3, s, timeout_ms=1000, name=f"rehome-{user}", replicas=2, file_dir=scratch,
                 rehome_ms=1500)
    err = workdir / f"rehome-{user}.err"
    prog = Program(h, workdir, cfg, user=user, err=err)
    srv[0].kill()
    srv[0].wait()
    prog.say("r", "read back")
    deadline = time.time() + 30
    while "copies made again" not in err.read_text() and time.time() < deadline:
        time.sleep(0.2)
    text = err.read_text()
    assert re.search(rf"server {re.escape(h.addr(0))} lost for \d+ s: 2 of its 2 places go to", text), text
    m = re.search(r"copies made again: (\d+) MiB", text)
    assert m and int(m.group(1)) >= 8, text
    prog.say("f", "forked")
    srv[1].kill()
    srv[1].wait()
    read_write_read(prog, err)
    print(m.group(0))


def test_a_rejoined_server_too_small_for_its_copies_ends_the_pass_loudly(workdir, hosts):
    """The killed server comes back with 4 MiB, less than its share of the copies: the
    pass ends at its first refused store with a warning naming the server, the program
    goes on, and every word still verifies from the other copies, written again too."""
    h, srv, prog, err = lose_and_rejoin(workdir, hosts, None, "4M")
    text = read_write_read(prog, err)
    assert f"copies not made again on server {h.addr(0)}" in text, text
    assert "copies made again:" not in text, text


def test_without_a_copy_left_a_region_fails_loudly(workdir, hosts):
    """Two copies on two servers; both killed: the next read ends with SIGBUS and names
    what was lost, never reads other data."""
    h = hosts(2)
    s = secret(workdir)
    srv = [h.serve(i, workdir, s, "--size", "256M")[0] for i in range(2)]
    prog = Program(h, workdir, config(workdir, h, 2, s, timeout_ms=1000, name="two", replicas=2))
    for p in srv:
        p.kill()
        p.wait()
    prog.p.stdin.write("r\n")
    prog.p.stdin.flush()
    out, err = prog.p.communicate(timeout=120)
    assert "WRONG DATA" not in out, out
    assert prog.p.returncode == -signal.SIGBUS, (prog.p.returncode, out, err)
    assert "lost" in err and h.addr(0) in err and h.addr(1) in err, err


def test_a_full_server_spills_to_the_next_tier(workdir, hosts):
    """A server of 8 MiB under a job of 48 MiB on 16 MiB of DRAM: what it cannot take
    (ENOSPC, refused whole) goes to the file tier behind it, and every word verifies."""
    h = hosts(1)
    _, log = h.serve(0, workdir, secret(workdir), "--size", "8M", "--lease", "2")
    p = subprocess.run(h.on_client([build(workdir, "integrity"), "48"]), capture_output=True, text=True,
                       timeout=300, env={**os.environ, "ATTUNE_CONFIG": str(config(workdir, h, 1, secret(workdir),
                                                                                     name="full")),
                                         "ATTUNE_DRAM": "16M", "TEST_BUDGET": str(16 * MIB)})
    assert p.returncode == 0 and "FAIL" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert "warning" not in p.stderr, p.stderr
    deadline = time.time() + 15
    while "expired" not in log.read_text() and time.time() < deadline:
        time.sleep(0.2)
    assert "8 MiB granted" in log.read_text() and stored_mib(log) > 0, log.read_text()


def test_a_server_nobody_answers_leaves_the_tier_out_with_its_name(workdir, hosts):
    """No server listening: the runtime says which server did not answer and runs on its
    other tiers; nothing is lost."""
    h = hosts(1)
    p = subprocess.run(h.on_client([build(workdir, "integrity"), "24"]), capture_output=True, text=True,
                       timeout=120, env={**os.environ, "ATTUNE_CONFIG": str(config(workdir, h, 1, secret(workdir),
                                                                                     timeout_ms=500, name="none")),
                                         "ATTUNE_DRAM": "8M", "TEST_BUDGET": str(8 * MIB)})
    assert p.returncode == 0, p.stdout + p.stderr
    assert h.addr(0) in p.stderr and "left out" in p.stderr, p.stderr


@pytest.mark.parametrize("args,want", [
    (["--listen", "nohost", "--secret-file", "{s}"], "is not HOST:PORT"),
    (["--listen", "127.0.0.1:99999", "--secret-file", "{s}"], "is not HOST:PORT"),
    (["--listen", "127.0.0.1:7798"], "--secret-file"),
    (["--listen", "127.0.0.1:7798", "--secret-file", "{short}"], "16 to"),
    (["--listen", "127.0.0.1:7798", "--secret-file", "{s}", "--size", "12Q"], "--size"),
    (["--listen", "127.0.0.1:7798", "--secret-file", "{s}", "--lease", "0"], "--lease"),
    (["--listen", "127.0.0.1:7798", "--secret-file", "{missing}"], "missing-secret"),
])
def test_memserver_refuses_bad_arguments_clearly(workdir, args, want):
    short = workdir / "short-secret"
    short.write_text("tooshort\n")
    os.chmod(short, 0o600)
    names = {"s": secret(workdir), "short": short, "missing": workdir / "missing-secret"}
    argv = [a.format(**names) for a in args]
    p = subprocess.run([ATTUNE, "memserver", *argv], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and want in p.stderr, p.stderr
