"""The remote tier (issue 25, item 2) against the fabric's own limits, side by side in one
run: a client host and one memory server as network namespaces on a bridge (the hosts of
tests/python/test_remote.py), libfabric over TCP (`provider = "tcp"`: the net provider on
libfabric 1.17, docs/design/remote.md "TCP without ofi_rxm").

For each repetition, interleaved: fi_pingpong between the two hosts (4 KiB: the raw round
trip a remote fault can at best cost; 1 MiB: the raw streaming bandwidth), then
`attune bench --core-only` on the client host with a remote tier on the server host:
random fault latency (fault-attune, 64 MiB budget), a sequential pass over twice a
256 MiB budget (seq-attune) and random updates (rand-attune), and the kernel's swap on
a memory-backed device at the same budget (rand-kswap-memory) as the baseline of the
random updates. Prints medians and the ratios the issue names.

`--cap RATE` caps each host's link with tbf (`8gbit`): the link is then the limit, as a
cluster's fabric is, instead of the two vCPUs that copy every byte through TCP here.

`--perf-server FILE` records server 0 with `perf record -e cpu-clock -g -o FILE` while
the first build's scenarios of the first repetition run, and prints the CPU seconds it
used over the seconds recorded (`perf report -i FILE --no-children --sort sym` reads it).

Usage: python3 bench/remote.py [--reps 3] [--servers 1] [--only fault,seq,rand]
       [--builds A/bin/attune,B/bin/attune] [--perf-server FILE] [--cap RATE]
(root; make build first; fi_pingpong from Debian's libfabric-bin). `--builds` runs the
remote-tier scenarios with each build in turn within every repetition (two checkouts
side by side: `git worktree add /tmp/old <commit> && make -C /tmp/old build`), the servers
and the baselines from this checkout's build.
"""
import argparse
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
ATTUNE = BUILD / "bin" / "attune"
sys.path.insert(0, str(ROOT / "tests" / "python"))
from test_remote import Hosts  # noqa: E402


@functools.cache
def tcp_provider():
    """The libfabric provider `provider = "tcp"` opens (attune-sys fabric_shim.c): net
    where the library has it (1.17), tcp otherwise; fi_pingpong measures the same one."""
    have = subprocess.run(["fi_info", "-p", "net", "-t", "FI_EP_RDM"], capture_output=True, text=True)
    return "net" if have.returncode == 0 and "provider: net" in have.stdout else "tcp"


def pingpong(h, size, iters):
    """fi_pingpong over the provider the tier opens between the client and server 0:
    (usec per transfer, MB/s)."""
    srv = subprocess.Popen(["ip", "netns", "exec", h.servers[0], "fi_pingpong", "-p", tcp_provider(), "-e", "rdm",
                            "-S", str(size), "-I", str(iters)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = subprocess.run(h.on_client(["fi_pingpong", "-p", tcp_provider(), "-e", "rdm", "-S", str(size), "-I",
                                          str(iters), h.addr(0).split(":")[0]]),
                             capture_output=True, text=True, timeout=120).stdout
    finally:
        srv.wait(timeout=30)
    # bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
    row = [line.split() for line in out.splitlines() if re.match(r"^\d+[kmg]?\s", line)]
    if not row:
        sys.exit(f"fi_pingpong gave no figures:\n{out}")
    return float(row[-1][6]), float(row[-1][5])


def attune_bench(h, env, only, attune=ATTUNE):
    """One `attune bench` scenario set on the client host (h None: in the root namespace,
    whose /sys shows the cgroups the kernel-swap baseline needs; `ip netns exec` mounts a
    /sys of its own), run by the build `attune`."""
    out = tempfile.mkdtemp(prefix="attune-remote-bench-")
    argv = ["env", *[f"{k}={v}" for k, v in env.items()], attune, "bench", "--core-only", "--reps",
            "1", "--only", only, "--out", out]
    cmd = h.on_client(argv) if h else argv
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{' '.join(map(str, cmd))} failed:\n{r.stdout}\n{r.stderr}")
        got = {}
        for s in json.load(open(os.path.join(out, "bench.json")))["results"]:
            for k, v in s.get("metrics", {}).items():
                got[(s["scenario"], k)] = v["median"]
        return got
    finally:
        subprocess.run(["rm", "-rf", out])


def cpu_seconds(pid):
    """User and system CPU seconds process `pid` has used."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--only", default="fault,seq,rand", help="scenario kinds: fault, seq, rand")
    ap.add_argument("--builds", default=str(ATTUNE), help="attune binaries to compare, comma-separated")
    ap.add_argument("--perf-server", metavar="FILE", help="perf record server 0 during the first scenarios")
    ap.add_argument("--cap", metavar="RATE", help="cap every host's link at RATE with tbf (e.g. 8gbit): a link, "
                                                  "not the CPU, is then the limit fi_pingpong measures")
    a = ap.parse_args()
    kinds = [k for k in ("fault", "seq", "rand") if k in a.only.split(",")]
    if not kinds or len(kinds) != len(set(a.only.split(","))):
        ap.error(f"--only takes fault, seq and rand, comma-separated (got '{a.only}')")
    builds = a.builds.split(",")
    for b in builds:
        if not os.access(b, os.X_OK):
            ap.error(f"--builds: {b} is not an executable attune")
    d = Path(tempfile.mkdtemp(prefix="attune-remote-"))
    os.chmod(d, 0o755)
    h = Hosts(a.servers)
    try:
        if a.cap:
            for ns, link in h.links.items():
                # The burst holds a few 64 KiB segments; the queue 10 ms of traffic.
                subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", link, "root", "tbf", "rate", a.cap,
                                "burst", "256kb", "latency", "10ms"], check=True)
        secret = d / "secret"
        subprocess.run([ATTUNE, "memserver", "--new-secret", secret], check=True, capture_output=True)
        cfg = d / "remote.toml"
        cfg.write_text(f"""[[tier]]
name = "remote"
kind = "remote"
capacity = "2G"
servers = "{','.join(h.addr(i) for i in range(a.servers))}"
secret_file = "{secret}"
""")
        mem = d / "memory.toml"
        mem.write_text('[[tier]]\nname = "memory"\nkind = "memory"\ncapacity = "2G"\n')
        rows = {k: [] for k in ("pp4k", "pp1m", "memory", "kswap")}
        remote = {b: [] for b in builds}
        for rep in range(a.reps):
            rows["pp4k"].append(pingpong(h, 4096, 5000))
            rows["pp1m"].append(pingpong(h, 1 << 20, 200))
            for b in builds:
                # Fresh servers for each build: none starts with the other's sessions.
                servers = [h.serve(i, d, secret, "--size", "3G") for i in range(a.servers)]
                perf = None
                if a.perf_server and rep == 0 and b == builds[0]:
                    # `ip netns exec` runs the server in its own process.
                    pid = servers[0][0].pid
                    perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-g", "-o", a.perf_server,
                                             "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(0.5)
                    cpu0, t0 = cpu_seconds(pid), time.monotonic()
                got = {}
                for k in kinds:
                    got.update(attune_bench(h, {"ATTUNE_CONFIG": cfg}, f"{k}-attune", b))
                remote[b].append(got)
                if perf:
                    cpu, wall = cpu_seconds(pid) - cpu0, time.monotonic() - t0
                    perf.send_signal(2)
                    perf.wait(timeout=60)
                    print(f"server 0 used {cpu:.2f} s of CPU over {wall:.2f} s of {', '.join(kinds)} "
                          f"({cpu / wall:.0%} of a CPU); profile in {a.perf_server}", flush=True)
                for p, _ in servers:
                    p.kill()
                    p.wait()
            got = {}
            for k in kinds:
                got.update(attune_bench(h, {"ATTUNE_CONFIG": mem}, f"{k}-attune"))
            rows["memory"].append(got)
            if "rand" in kinds:
                rows["kswap"].append(attune_bench(None, {}, "rand-kswap-memory")[("rand-kswap-memory",
                                                                                    "updates_per_s")])
        med = statistics.median
        rtt = med(r[0] for r in rows["pp4k"]) * 2
        bw = med(r[1] for r in rows["pp1m"]) / 1000
        print(f"fi_pingpong {tcp_provider()} rdm, client and server hosts: 4 KiB {rtt / 2:.1f} us a transfer "
              f"(round trip {rtt:.1f} us); 1 MiB {bw:.3f} GB/s")
        for b in builds:
            if len(builds) > 1:
                print(f"\nbuild {b}:")
            table(a, rows, remote[b], kinds, rtt, bw)
    finally:
        h.close()
        subprocess.run(["rm", "-rf", str(d)])


def table(a, rows, remote, kinds, rtt, bw):
    """The table of one build's remote-tier medians against the limits and baselines."""
    med = statistics.median
    print(f"\n| scenario | metric | remote tier ({a.servers} server(s)) | in-process memory tier | remote / limit |")
    print("|---|---|---|---|---|")
    for scen, metric in (("fault-attune-thread", "fault_median_us"), ("fault-attune-signal", "fault_median_us"),
                         ("fault-attune-thread", "fault_p99_us"), ("fault-attune-signal", "fault_p99_us"),
                         ("seq-attune-thread", "seq_read_gbps"), ("seq-attune-signal", "seq_read_gbps"),
                         ("rand-attune-thread", "updates_per_s"), ("rand-attune-signal", "updates_per_s")):
        if scen.split("-")[0] not in kinds:
            continue
        r = med(x[(scen, metric)] for x in remote)
        m = med(x[(scen, metric)] for x in rows["memory"])
        if metric == "fault_median_us":
            lim = f"{r / rtt:.2f}x the round trip (goal <= 2)"
        elif metric == "seq_read_gbps":
            lim = f"{r / bw:.0%} of fi_pingpong's 1 MiB bandwidth (goal >= 70%)"
        elif metric == "updates_per_s":
            lim = f"{r / med(rows['kswap']):.2f}x kernel swap on memory (goal >= 1)"
        else:
            lim = ""
        print(f"| {scen} | {metric} | {r:.3g} | {m:.3g} | {lim} |")
    if "rand" in kinds:
        print(f"| rand-kswap-memory | updates_per_s | {med(rows['kswap']):.3g} (kernel swap on memory, same budget) "
              "| | |")


if __name__ == "__main__":
    main()
