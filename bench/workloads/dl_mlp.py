"""DL: a surrogate model trained on synthetic simulation data (bandwidth- and data-
intensive, BW). scikit-learn's MLPRegressor, mini-batch passes over an in-memory float64
dataset of MiB; the known answer: the target is a fixed smooth function of the inputs,
and the trained model's R^2 on held-out data must exceed 0.9.

Usage: python3 dl_mlp.py MiB
"""
import sys
import time

import numpy as np
from sklearn.neural_network import MLPRegressor

mib = int(sys.argv[1]) if len(sys.argv) > 1 else 128
d = 32
n = (mib << 20) // (8 * (d + 1))
rng = np.random.default_rng(1)
x = rng.standard_normal((n, d))
w = rng.standard_normal(d) / np.sqrt(d)
y = np.tanh(x @ w) + 0.1 * np.sin(x[:, 0])
cut = int(n * 0.9)
t0 = time.perf_counter()
m = MLPRegressor(hidden_layer_sizes=(64,), batch_size=1024, max_iter=3, tol=0, random_state=0,
                 learning_rate_init=3e-3)
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    m.fit(x[:cut], y[:cut])
secs = time.perf_counter() - t0
r2 = m.score(x[cut:], y[cut:])
ok = r2 > 0.9
print(f"RESULT dl {'OK' if ok else 'BAD'} seconds={secs:.4f} r2={r2:.4f} samples={n}")
sys.exit(0 if ok else 1)
