"""attune run test: Python multiprocessing with the fork start method (the default on
Linux before 3.14, and what DataLoader workers use). The parent builds numpy arrays larger
than the budget; forked workers read them (inherited managed memory, some of it in a far
tier at the fork) and compute sums of slices; the parent checks each against its own.
Usage: python3 mp_fork.py MiB WORKERS"""
import multiprocessing as mp
import sys

import numpy as np

mib = int(sys.argv[1]) if len(sys.argv) > 1 else 96
workers = int(sys.argv[2]) if len(sys.argv) > 2 else 3
n = (mib << 20) // 8 // 2
a = np.arange(n, dtype=np.float64)
b = (np.arange(n, dtype=np.float64) * 3.0) % 1021.0


def part(k):
    lo, hi = k * n // 8, (k + 1) * n // 8
    # Workers also write: their own copy, never the parent's.
    a[lo:hi] += 1.0
    return float(a[lo:hi].sum() - (hi - lo)), float(b[lo:hi].sum())


if __name__ == "__main__":
    ctx = mp.get_context("fork")
    with ctx.Pool(workers) as pool:
        got = pool.map(part, range(8))
    want = [(float(a[k * n // 8:(k + 1) * n // 8].sum()), float(b[k * n // 8:(k + 1) * n // 8].sum())) for k in range(8)]
    bad = [k for k in range(8) if got[k] != want[k]]
    if bad or a[0] != 0.0:
        print("mp_fork: BAD slices", bad, "a[0] =", a[0])
        sys.exit(1)
    print("mp_fork: OK", n, "doubles x2,", workers, "workers")
