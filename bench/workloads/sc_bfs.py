"""SC: breadth-first search with igraph on a binary tree, as in IMME's SC workflow
(short-lived, SHL). Verified: in a complete binary tree rooted at 0 the depth of vertex v
is floor(log2(v + 1)).

Usage: python3 sc_bfs.py MiB
"""
import sys
import time

import igraph as ig
import numpy as np

mib = int(sys.argv[1]) if len(sys.argv) > 1 else 128
n = max(1024, (mib << 20) // 120)
g = ig.Graph.Tree(n, 2)
t0 = time.perf_counter()
order, layers, parents = g.bfs(0)
secs = time.perf_counter() - t0
depth = np.empty(n, dtype=np.int64)
for d in range(len(layers) - 1):
    depth[order[layers[d]:layers[d + 1]]] = d
want = np.floor(np.log2(np.arange(n) + 1)).astype(np.int64)
ok = len(order) == n and np.array_equal(depth, want)
print(f"RESULT sc {'OK' if ok else 'BAD'} seconds={secs:.4f} vertices={n} depth={int(depth.max())}")
sys.exit(0 if ok else 1)
