"""attune run test: numpy arrays larger than the budget; results checked exactly.

Usage: python3 numpy_work.py MiB
"""
import sys

import numpy as np

mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
n = (mib << 20) // 8 // 2
a = np.arange(n, dtype=np.int64)          # malloc-backed data buffers
b = np.zeros(n, dtype=np.int64)           # calloc
b += 3
c = a * 2 + b                             # temporaries
assert int(c.sum()) == 2 * (n - 1) * n // 2 + 3 * n
rng = np.random.default_rng(7)
idx = rng.integers(0, n, 200_000)
assert np.array_equal(c[idx], idx * 2 + 3)
d = np.concatenate([a, a])                # realloc-free growth by copy
assert int(d[n + 12345]) == 12345
print("numpy_work: OK", n)
