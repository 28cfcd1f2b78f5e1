"""attune run test: children started with multiprocessing.Process under the fork start
method, each a thread-starting Python process that reads numpy arrays it inherited (some
of them in a far tier at the fork) and checks its slice. A new thread's start in glibc
reads the global locale's data with every signal blocked, and under --small that data is
managed: a child whose copy of it was moved out died of SIGBUS before its first line
(docs/design/processes.md, "The child serves its faults inline while its threads start").
Usage: python3 mp_process.py MiB CHILDREN; prints "mp_process: OK" when every child exits 0."""
import multiprocessing as mp
import sys

import numpy as np

mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
children = int(sys.argv[2]) if len(sys.argv) > 2 else 3
n = (mib << 20) // 8 // 2
a = np.arange(n, dtype=np.float64)
b = (np.arange(n, dtype=np.float64) * 3.0) % 1021.0


def part(k):
    lo, hi = k * n // children, (k + 1) * n // children
    a[lo:hi] += 1.0
    got = float(a[lo:hi].sum() - (hi - lo))
    want = float(np.arange(lo, hi, dtype=np.float64).sum())
    sys.exit(0 if got == want and b[lo] == (lo * 3.0) % 1021.0 else 3)


if __name__ == "__main__":
    ctx = mp.get_context("fork")
    ps = [ctx.Process(target=part, args=(k,)) for k in range(children)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    codes = [p.exitcode for p in ps]
    if any(c != 0 for c in codes) or a[0] != 0.0:
        print("mp_process: BAD exit codes", codes, "a[0] =", a[0])
        sys.exit(1)
    print("mp_process: OK", children, "children")
