"""rMap's figures with the remote tier on this machine (issue 25;
../shared/papers/memory-underutilization-rmap.txt, Figures 6 and 7): client and server hosts
as network namespaces on a bridge (the hosts of tests/python/test_remote.py), libfabric's
tcp provider, `attune memserver` on each server host.

Figure 6, the transfer unit: one client, one server. bench/unit_patterns.c's sequential
passes and random 8-byte reads over --mib MiB under `attune run` at a quarter of it in
DRAM, with fixed units from 4 KiB to 2 MiB (read-ahead off: the units rMap sweeps) and
Attune's default (4 KiB chunks, read-ahead learned per stream). Reported: seconds, MB/s of
the pages the pattern touched, and bytes fetched over them (amplification). A run longer
than --cut seconds is stopped and shown as such.

Figure 7, scaling: 1, 2 and 4 servers against 1, 2, 4 and 8 client processes at once,
each making sequential passes, then random reads, over its own --mib / 2 MiB at a
quarter of it in DRAM (pages spread over the servers by 64 KiB unit), Attune's default
unit. Reported: the aggregate rate (the sum of the clients' MB/s of touched pages, which
run at once) and, in brackets, the rate per client.

rMap's case studies (--only cases): BFS and XSBench (bench/workloads/bfs.c, xsbench.c,
--case-mib MiB each) on the client host, first all in DRAM (no Attune: the baseline and
the peak RSS), then under `attune run` with 25%, 50% and 75% of that peak as local
memory, the rest through one server, and the same with the rest in the process (the
in-process memory tier: a fault without the network). Reported: wall seconds, the
kernel's own phase (the workload's RESULT line), both over the all-DRAM run, faults,
bytes fetched, and the workload's own check of its answer.

The remote tier's concurrency (--only concurrency): one client, one server, 16 threads
sharing random 8-byte reads and 4 threads streaming their quarters (unit_patterns
random-threads and threads, --mib MiB at a quarter in DRAM), with 1 to 64 loads and
stores in flight (`concurrency`), interleaved --reps times. Reported: the medians' MB/s
of touched pages, and each run's sum against the first (the same reads, the same answer).

One cell of Figure 7, run --reps times with fresh servers each time (the aggregate and each
client's seconds per run): --cell SERVERS,CLIENTS,PATTERN, e.g. --cell 4,8,seq.

Usage: python3 bench/rmap.py [--mib 64] [--cut 60] [--only 6,7,cases,concurrency] [--case-mib 128]
       [--cell S,C,P --reps N]
       (root; make build first)
"""
import argparse
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
ATTUNE = ROOT / "build" / "bin" / "attune"
sys.path.insert(0, str(ROOT / "tests" / "python"))
from test_remote import Hosts  # noqa: E402

MIB = 1 << 20
UNITS = [("4K", {"ATTUNE_READAHEAD": "0"}), ("16K", {"ATTUNE_READAHEAD": "0"}),
         ("64K", {"ATTUNE_READAHEAD": "0"}), ("256K", {"ATTUNE_READAHEAD": "0"}),
         ("1M", {"ATTUNE_READAHEAD": "0"}), ("2M", {"ATTUNE_READAHEAD": "0"}), ("default", {})]


def config(d, h, n, secret):
    p = d / f"remote-{n}.toml"
    p.write_text(f"""[[tier]]
name = "remote"
kind = "remote"
capacity = "2G"
servers = "{','.join(h.addr(i) for i in range(n))}"
secret_file = "{secret}"
""")
    os.chmod(p, 0o644)
    return p


def client(h, exe, cfg, pattern, mib, chunk, env, report):
    """Starts one unit_patterns process on the client host under `attune run`."""
    args = ["--chunk", chunk] if chunk != "default" else []
    cmd = h.on_client(["env", *[f"{k}={v}" for k, v in env.items()], ATTUNE, "run", "-q", "--config", cfg,
                       "--dram", f"{max(mib // 4, 2)}M", "--report", report, *args, "--", exe, pattern, str(mib)])
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p, cut, report, answer=None):
    """(seconds, touched bytes, fetched bytes) of a client; None when cut, "failed" when
    it failed. `answer`, a dict, gets the pattern's sum under "sum"."""
    try:
        out, err = p.communicate(timeout=cut)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return None
    if p.returncode != 0:
        # Shown in its cell (a lost server ends the program with SIGBUS, by design).
        why = next((line for line in err.splitlines() if "lost" in line), err.strip()[-200:])
        print(f"  a client failed ({p.returncode}): {why}", file=sys.stderr, flush=True)
        return "failed"
    if "warning" in err:
        # A client that lost a server and went on (other copies, the next tier).
        print(f"  a client warned: {err.strip()[-300:]}", file=sys.stderr, flush=True)
    f = dict(kv.split("=") for kv in out.split()[1:])
    if answer is not None:
        answer["sum"] = f["sum"]
    fetched = json.load(open(report))["totals"]["fetched_bytes"]
    return float(f["secs"]), int(f["touched"]), fetched


def figure6(h, d, exe, secret, a):
    servers = [h.serve(0, d, secret, "--size", "2G")]
    cfg = config(d, h, 1, secret)
    print(f"\nFigure 6: transfer unit, 1 client, 1 server, {a.mib} MiB at a quarter in DRAM "
          "(fixed units with read-ahead off; default: 4 KiB chunks with learned read-ahead)\n")
    print("| pattern | unit | seconds | MB/s touched | amplification |")
    print("|---|---|---|---|---|")
    try:
        for pattern in ("seq", "random"):
            for unit, env in UNITS:
                rep = d / f"f6-{pattern}-{unit}.json"
                r = finish(client(h, exe, cfg, pattern, a.mib, unit, env, rep), a.cut, rep)
                if r is None or r == "failed":
                    print(f"| {pattern} | {unit} | {'failed' if r else f'> {a.cut} (stopped)'} | | |")
                    continue
                secs, touched, fetched = r
                print(f"| {pattern} | {unit} | {secs:.2f} | {touched / secs / 1e6:.0f} | {fetched / touched:.2f} |",
                      flush=True)
    finally:
        for p, _ in servers:
            p.kill()
            p.wait()


def cell(h, d, exe, secret, a, n, c, pattern):
    """c clients at once through n fresh servers (each cell its own: the figures measure
    the cell, not what earlier clients left on the servers); each client's result."""
    cfg = config(d, h, n, secret)
    servers = [h.serve(i, d, secret, "--size", "2G") for i in range(n)]
    try:
        reps = [d / f"f7-{n}-{pattern}-{c}-{k}.json" for k in range(c)]
        procs = [client(h, exe, cfg, pattern, a.mib // 2, "default", {}, r) for r in reps]
        return [finish(p, a.cut, r) for p, r in zip(procs, reps)]
    finally:
        for p, _ in servers:
            p.kill()
            p.wait()


def one_cell(h, d, exe, secret, a):
    n, c, pattern = a.cell.split(",")
    n, c = int(n), int(c)
    print(f"\n{c} client(s) through {n} server(s), {pattern}, {a.mib // 2} MiB each at a quarter in DRAM\n")
    print("| run | aggregate MB/s | seconds per client | failed |")
    print("|---|---|---|---|")
    for k in range(a.reps):
        res = cell(h, d, exe, secret, a, n, c, pattern)
        ok = [r for r in res if r not in (None, "failed")]
        agg = sum(r[1] / r[0] for r in ok) / 1e6
        secs = " ".join(f"{r[0]:.2f}" for r in ok)
        print(f"| {k + 1} | {agg:.0f} | {secs} | {len(res) - len(ok)} |", flush=True)


def figure7(h, d, exe, secret, a):
    clients = [1, 2, 4, 8]
    rows = {"seq": [], "random": []}
    for n in (1, 2, 4):
        for pattern in rows:
            cells = []
            for c in clients:
                res = cell(h, d, exe, secret, a, n, c, pattern)
                if "failed" in res:
                    cells.append(f"{res.count('failed')} of {c} failed")
                elif None in res:
                    cells.append(f"> {a.cut} s")
                else:
                    # The clients run at once: their rates add up.
                    agg = sum(r[1] / r[0] for r in res) / 1e6
                    cells.append(f"{agg:.0f} ({agg / c:.0f})")
            rows[pattern].append(cells)
    for pattern, table in rows.items():
        print(f"\nFigure 7, {pattern}: servers against clients, each client {a.mib // 2} MiB at a quarter "
              "in DRAM; aggregate MB/s of touched pages (per client)\n")
        print("| servers | " + " | ".join(f"{c} client(s)" for c in clients) + " |")
        print("|---|" + "---|" * len(clients))
        for n, cells in zip((1, 2, 4), table):
            print(f"| {n} | " + " | ".join(cells) + " |", flush=True)


CONCURRENCY = [1, 2, 4, 8, 16, 32, 64]


def concurrency(h, d, exe, secret, a):
    """MB/s of touched pages per (pattern, concurrency), medians of --reps interleaved runs
    on one fresh server each; every run's sum checked against the pattern's first."""
    cfg = config(d, h, 1, secret)
    patterns = ("random-threads", "threads")
    rates = {(p, c): [] for p in patterns for c in CONCURRENCY}
    sums, bad = {}, 0
    for rep in range(a.reps):
        for pattern in patterns:
            for c in CONCURRENCY:
                servers = [h.serve(0, d, secret, "--size", "2G")]
                try:
                    r = d / f"cc-{pattern}-{c}.json"
                    ans = {}
                    env = {"ATTUNE_TIER_REMOTE_CONCURRENCY": str(c)}
                    res = finish(client(h, exe, cfg, pattern, a.mib, "default", env, r), a.cut, r, ans)
                finally:
                    for p, _ in servers:
                        p.kill()
                        p.wait()
                if res in (None, "failed"):
                    continue
                if sums.setdefault(pattern, ans["sum"]) != ans["sum"]:
                    bad += 1
                    print(f"  {pattern} at concurrency {c}: sum {ans['sum']}, not {sums[pattern]}", file=sys.stderr)
                rates[(pattern, c)].append(res[1] / res[0] / 1e6)
    print(f"\nThe remote tier's concurrency: 1 client, 1 server, {a.mib} MiB at a quarter in DRAM; MB/s of "
          f"touched pages, medians of {a.reps} (runs that failed or were cut left out)\n")
    print("| pattern | " + " | ".join(f"{c}" for c in CONCURRENCY) + " |")
    print("|---|" + "---|" * len(CONCURRENCY))
    for pattern in patterns:
        cells = [f"{statistics.median(rates[(pattern, c)]):.0f}" if rates[(pattern, c)] else "-"
                 for c in CONCURRENCY]
        print(f"| {pattern} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nsums: {bad} run(s) disagreed with their pattern's first")


def run_case(h, argv, cut):
    """Runs argv on the client host: (wall seconds, peak RSS in bytes, stdout, exit status),
    or None when stopped after `cut` seconds. The peak is this child's own (`wait4`):
    `ip netns exec` runs the program in its own process."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(h.on_client(argv), stdout=out, stderr=err, text=True)
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > cut:
                p.kill()
                os.wait4(p.pid, 0)
                return None
            time.sleep(0.02)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        text = out.read()
        if p.returncode != 0:
            print(f"  {' '.join(map(str, argv[-3:]))} failed ({p.returncode}): {err.read().strip()[-300:]}",
                  file=sys.stderr)
        return wall, ru.ru_maxrss << 10, text, p.returncode


def cases(h, d, secret, a):
    cfg = config(d, h, 1, secret)
    # The same fractions with the far pages in the process (no network): what the
    # server's round trips cost beyond a fault's own.
    mem = d / "memory.toml"
    mem.write_text('[[tier]]\nname = "memory"\nkind = "memory"\ncapacity = "2G"\n')
    os.chmod(mem, 0o644)
    print(f"\nrMap's case studies: BFS and XSBench, {a.case_mib} MiB each, local memory as a share of the "
          "all-DRAM peak RSS, the rest on one memory server\n")
    print("| workload | local memory | wall s | x all-DRAM | kernel s | x all-DRAM | faults | fetched MiB | "
          "answer |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w in ("bfs", "xsbench"):
        exe = d / w
        subprocess.run(["gcc", "-O2", "-I", ROOT / "bench" / "workloads", ROOT / "bench" / "workloads" / f"{w}.c",
                        "-o", exe, "-lm"], check=True)
        base = run_case(h, [exe, str(a.case_mib)], a.cut)
        if base is None or base[3] != 0:
            print(f"| {w} | 100% (no Attune) | failed | | | | | | |")
            continue
        wall0, peak, out0, _ = base
        k0 = float(re.search(r"seconds=([\d.]+)", out0).group(1))
        print(f"| {w} | 100% (no Attune, peak {peak >> 20} MiB) | {wall0:.2f} | 1.00 | {k0:.3f} | 1.00 | | | "
              f"{'OK' if ' OK ' in out0 else 'BAD'} |", flush=True)
        for frac in (0.75, 0.5, 0.25):
            for far, c in (("server", cfg), ("memory", mem)):
                servers = [h.serve(0, d, secret, "--size", "2G")] if far == "server" else []
                rep = d / f"case-{w}-{frac}-{far}.json"
                try:
                    r = run_case(h, [ATTUNE, "run", "-q", "--config", c, "--dram", f"{int(peak * frac) >> 20}M",
                                     "--report", rep, "--", exe, str(a.case_mib)], a.cut)
                finally:
                    for p, _ in servers:
                        p.kill()
                        p.wait()
                where = f"{frac:.0%}, rest {'on one memory server' if far == 'server' else 'in the process (memory tier)'}"
                if r is None or r[3] != 0:
                    print(f"| {w} | {where} | {'failed' if r else f'> {a.cut} (stopped)'} | | | | | | |", flush=True)
                    continue
                wall, _, out, _ = r
                k = float(re.search(r"seconds=([\d.]+)", out).group(1))
                t = json.load(open(rep))["totals"]
                print(f"| {w} | {where} | {wall:.2f} | {wall / wall0:.2f} | {k:.3f} | {k / k0:.2f} | {t['faults']} | "
                      f"{t['fetched_bytes'] / (1 << 20):.0f} | {'OK' if ' OK ' in out else 'BAD'} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--cut", type=int, default=60, help="seconds before a run is stopped")
    ap.add_argument("--only", default="6,7", help="6, 7, cases, concurrency")
    ap.add_argument("--case-mib", type=int, default=128, help="MiB of each case study's workload")
    ap.add_argument("--cell", help="SERVERS,CLIENTS,PATTERN: one cell of Figure 7 only")
    ap.add_argument("--reps", type=int, default=3, help="runs of --cell")
    a = ap.parse_args()
    if not set(a.only.split(",")) <= {"6", "7", "cases", "concurrency"}:
        ap.error(f"--only takes 6, 7, cases and concurrency, comma-separated (got '{a.only}')")
    if a.cell and (len(a.cell.split(",")) != 3 or a.cell.split(",")[2] not in ("seq", "random")):
        ap.error("--cell takes SERVERS,CLIENTS,PATTERN with PATTERN seq or random (e.g. 4,8,seq)")
    d = Path(tempfile.mkdtemp(prefix="attune-rmap-"))
    os.chmod(d, 0o755)
    exe = d / "unit_patterns"
    subprocess.run(["gcc", "-O2", "-pthread", ROOT / "bench" / "unit_patterns.c", "-o", exe], check=True)
    secret = d / "secret"
    subprocess.run([ATTUNE, "memserver", "--new-secret", secret], check=True, capture_output=True)
    h = Hosts(4)
    try:
        if a.cell:
            one_cell(h, d, exe, secret, a)
            return
        if "6" in a.only.split(","):
            figure6(h, d, exe, secret, a)
        if "7" in a.only.split(","):
            figure7(h, d, exe, secret, a)
        if "cases" in a.only.split(","):
            cases(h, d, secret, a)
        if "concurrency" in a.only.split(","):
            concurrency(h, d, exe, secret, a)
    finally:
        h.close()
        subprocess.run(["rm", "-rf", str(d)])


if __name__ == "__main__":
    main()
