"""Windows fetched ahead by the remote tier (issue 25, docs/benchmarks.md "Windows fetched
ahead by the remote tier"): bench/unit_patterns.c under `attune run` through one memory
server, a client host and a server host as network namespaces (the hosts of
tests/python/test_remote.py), each build alternated within every repetition. Prints the
seconds of each (build, delivery, pattern) with their median, and the first run's
remote-tier exit line (KiB fetched ahead and placed).

Usage: python3 bench/ahead.py [--reps 5] [--builds A/bin/attune,B/bin/attune]
       [--cases signal:seq:256:64M,...] [--env ATTUNE_TIER_REMOTE_AHEAD=0]
       [--perf FILE]
(root; make build first). `--perf FILE` records the first case of the last build with
`perf record -e cpu-clock -g` (`perf report -i FILE --no-children --sort comm,sym`).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ATTUNE = ROOT / "build" / "bin" / "attune"
sys.path.insert(0, str(ROOT / "tests" / "python"))
from test_remote import Hosts  # noqa: E402

CASES = "signal:seq:256:64M,thread:seq:256:64M,signal:threads:256:64M,signal:random:64:16M"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--builds", default=str(ATTUNE), help="attune binaries, comma-separated")
    ap.add_argument("--cases", default=CASES, help="DELIVERY:PATTERN:MIB:DRAM, comma-separated")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for every run")
    ap.add_argument("--perf", metavar="FILE")
    a = ap.parse_args()
    builds = a.builds.split(",")
    for b in builds:
        if not os.access(b, os.X_OK):
            ap.error(f"--builds: {b} is not an executable attune")
    cases = []
    for c in a.cases.split(","):
        parts = c.split(":")
        if len(parts) != 4 or parts[0] not in ("signal", "thread") or not parts[2].isdigit():
            ap.error(f"--cases: '{c}' is not DELIVERY:PATTERN:MIB:DRAM (signal or thread)")
        cases.append(parts)
    if any("=" not in e for e in a.env):
        ap.error("--env takes KEY=VALUE")
    d = Path(tempfile.mkdtemp(prefix="attune-ahead-"))
    os.chmod(d, 0o755)
    exe = d / "unit_patterns"
    subprocess.run(["gcc", "-O2", "-pthread", ROOT / "bench" / "unit_patterns.c", "-o", exe], check=True)
    h = Hosts(1)
    secs = {}
    lines = {}
    try:
        secret = d / "secret"
        subprocess.run([ATTUNE, "memserver", "--new-secret", secret], check=True, capture_output=True)
        cfg = d / "remote.toml"
        cfg.write_text(f'[[tier]]\nname = "remote"\nkind = "remote"\ncapacity = "2G"\n'
                       f'servers = "{h.addr(0)}"\nsecret_file = "{secret}"\n')
        h.serve(0, d, secret, "--size", "3G")
        for rep in range(a.reps):
            for mode, pattern, mib, dram in cases:
                for b in builds:
                    perf = []
                    if a.perf and rep == a.reps - 1 and b == builds[-1] and [mode, pattern, mib, dram] == cases[0]:
                        perf = ["perf", "record", "-e", "cpu-clock", "-g", "-o", a.perf]
                    argv = ["env", f"ATTUNE_CONFIG={cfg}", "ATTUNE_LOG=info", *a.env, *perf, b, "run", "-q",
                            "--fault-mode", mode, "--dram", dram, "--", exe, pattern, mib]
                    r = subprocess.run(h.on_client(argv), capture_output=True, text=True, timeout=600)
                    m = re.search(r"secs=([\d.]+)", r.stdout)
                    if r.returncode != 0 or not m:
                        sys.exit(f"{' '.join(map(str, argv))} failed:\n{r.stdout}\n{r.stderr[-2000:]}")
                    key = (b, mode, pattern, mib, dram)
                    secs.setdefault(key, []).append(float(m.group(1)))
                    ex = re.search(r"\d+ KiB fetched ahead.*", r.stderr)
                    lines.setdefault(key, ex.group(0) if ex else "(no remote-tier exit line)")
    finally:
        h.close()
        subprocess.run(["rm", "-rf", d])
    print("| build | delivery | pattern | MiB | DRAM | median s | runs | first run's exit line |")
    print("|---|---|---|---|---|---|---|---|")
    for (b, mode, pattern, mib, dram), v in secs.items():
        print(f"| {b} | {mode} | {pattern} | {mib} | {dram} | {statistics.median(v):.3f} | "
              f"{' '.join(f'{x:.3f}' for x in v)} | {lines[(b, mode, pattern, mib, dram)]} |")


if __name__ == "__main__":
    main()
