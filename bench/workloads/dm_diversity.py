"""DM: an ETL step over a generated census-like table that computes a diversity index per
region (latency-sensitive, LAT): pandas filters, joins a region table, groups and
computes Simpson's diversity 1 - sum(p_i^2) over race/ethnicity shares. Verified against
the same index computed with numpy bincounts.

Usage: python3 dm_diversity.py MiB
"""
import sys
import time

import numpy as np
import pandas as pd

mib = int(sys.argv[1]) if len(sys.argv) > 1 else 128
n = (mib << 20) // 40
rng = np.random.default_rng(2)
regions = 3000
people = pd.DataFrame({
    "county": rng.integers(0, regions, n, dtype=np.int32),
    "group": rng.choice(7, n, p=[.4, .2, .15, .1, .08, .05, .02]).astype(np.int8),
    "age": rng.integers(0, 95, n, dtype=np.int16),
    "income": rng.gamma(2.0, 25000.0, n).astype(np.float32),
})
counties = pd.DataFrame({"county": np.arange(regions, dtype=np.int32),
                         "state": (np.arange(regions) % 50).astype(np.int16)})
t0 = time.perf_counter()
adults = people[people["age"] >= 18]
joined = adults.merge(counties, on="county", how="left")
counts = joined.groupby(["state", "group"]).size().unstack(fill_value=0)
shares = counts.div(counts.sum(axis=1), axis=0)
diversity = 1.0 - (shares ** 2).sum(axis=1)
secs = time.perf_counter() - t0
# The same index from numpy alone.
mask = people["age"].to_numpy() >= 18
st = (people["county"].to_numpy()[mask] % 50)
gr = people["group"].to_numpy()[mask]
c = np.bincount(st * 7 + gr, minlength=350).reshape(50, 7).astype(float)
want = 1.0 - ((c / c.sum(axis=1, keepdims=True)) ** 2).sum(axis=1)
ok = np.allclose(diversity.sort_index().to_numpy(), want)
print(f"RESULT dm {'OK' if ok else 'BAD'} seconds={secs:.4f} rows={n} mean_index={want.mean():.6f}")
sys.exit(0 if ok else 1)
