"""Huge pages (issue 28): a random pointer chase over a buffer that fits in DRAM, on 4 KiB
pages against 2 MiB ones (tests/run/huge_pages.c, `bench` mode: every read's address
comes from the one before, so each pays its TLB miss).

Variants, interleaved run by run so all see the same machine load; medians printed:
  kernel 4K        the program alone (glibc malloc; THP 'madvise' here: 4 KiB pages)
  kernel THP       the program alone with glibc.malloc.hugetlb=1 (malloc asks MADV_HUGEPAGE)
  attune off       attune run, huge_pages=off (every managed page 4 KiB, as before)
  attune auto      attune run, huge_pages=auto (the default)
The budget is twice the buffer, so nothing is evicted: the TLB is all that differs.

Usage: python3 bench/huge.py [--mib 512] [--reps 3] [--accesses 20000000]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--accesses", type=int, default=20_000_000)
    a = ap.parse_args()
    attune = os.path.join(ROOT, "build", "bin", "attune")
    if not os.path.exists(attune):
        sys.exit("make build first")
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "huge_pages")
        subprocess.run(["gcc", "-O2", os.path.join(ROOT, "tests", "run", "huge_pages.c"), "-o", exe], check=True)
        # The program waits up to 30 s for its buffer to be on huge pages where some are
        # expected (the kernel's at fault time, Attune's within a few passes).
        def prog(wait, whole=False):
            # Attune's regions are 2 MiB-aligned: it waits for all of the buffer, so that
            # the timing never starts with the pass's last spans still to come.
            return [exe, "bench", str(a.mib), str(wait), str(a.accesses)] + ([str(a.mib)] if whole else [])
        run = [attune, "run", "-q", "--dram", f"{2 * a.mib}M", "--"]
        variants = [
            ("kernel 4K", prog(0), {}),
            ("kernel THP", prog(30), {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}),
            ("attune off", run + prog(0), {"ATTUNE_HUGE_PAGES": "off"}),
            ("attune auto", run + prog(30, whole=True), {"ATTUNE_HUGE_PAGES": "auto"}),
        ]
        ns = {v[0]: [] for v in variants}
        huge = {v[0]: [] for v in variants}
        for _ in range(a.reps):
            for name, cmd, env in variants:
                out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
                m = re.search(r"(\d+) MiB on huge pages, ([\d.]+) ns per read", out.stdout)
                if out.returncode != 0 or not m:
                    sys.exit(f"{name}: {' '.join(cmd)} failed: {out.stdout} {out.stderr}")
                huge[name].append(int(m.group(1)))
                ns[name].append(float(m.group(2)))
    base = statistics.median(ns["attune off"])
    print(f"pointer chase over {a.mib} MiB, {a.accesses} reads, {a.reps} reps (median; all runs)")
    print(f"{'variant':<12} {'MiB huge':>9} {'ns/read':>8} {'vs attune off':>14}  runs")
    for name in ns:
        med = statistics.median(ns[name])
        print(f"{name:<12} {statistics.median(huge[name]):>9.0f} {med:>8.1f} {base / med:>13.2f}x  "
              + " ".join(f"{x:.1f}" for x in ns[name]))


if __name__ == "__main__":
    main()
