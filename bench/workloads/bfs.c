/* Graph500-style breadth-first search: a Kronecker (R-MAT, A=.57 B=.19 C=.19) graph of
 * 2^scale vertices and 16 edges per vertex in CSR, scale chosen from MiB; BFS from a
 * vertex with edges; the parent tree is validated (every tree edge is a graph edge,
 * levels differ by one, every vertex adjacent to a visited one is visited). Usage: bfs MiB */
#include "common.h"

int main(int argc, char **argv) {
  size_t mib = arg_mib(argc, argv, 256);
  int scale = 10;
  while (((size_t)16 << (scale + 1)) * 2 * 8 + ((size_t)1 << (scale + 1)) * 24 < (mib << 20)) scale++;
  size_t nv = (size_t)1 << scale, ne = 16 * nv;
  uint32_t *src = xmalloc(ne * 4), *dst = xmalloc(ne * 4);
  uint64_t x = 5;
  for (size_t e = 0; e < ne; e++) {
    uint32_t u = 0, v = 0;
    for (int b = 0; b < scale; b++) {
      x = mix64(x + e * 64 + b);
      double r = (double)(x % 1000000) / 1e6;
      int ub = r >= 0.57 + 0.19, vb = (r >= 0.57 && r < 0.76) || r >= 0.95;
      u = u << 1 | ub; v = v << 1 | vb;
    }
    src[e] = (uint32_t)(mix64(u) % nv); dst[e] = (uint32_t)(mix64(v) % nv);
  }
  uint64_t *off = calloc(nv + 1, 8);
  uint32_t *adj = xmalloc(ne * 2 * 4);
  for (size_t e = 0; e < ne; e++) { off[src[e] + 1]++; off[dst[e] + 1]++; }
  for (size_t v = 0; v < nv; v++) off[v + 1] += off[v];
  uint64_t *fill = xmalloc(nv * 8);
  for (size_t v = 0; v < nv; v++) fill[v] = off[v];
  for (size_t e = 0; e < ne; e++) { adj[fill[src[e]]++] = dst[e]; adj[fill[dst[e]]++] = src[e]; }
  free(fill); free(src); free(dst);
  int64_t *parent = xmalloc(nv * 8), *level = xmalloc(nv * 8);
  uint32_t *queue = xmalloc(nv * 4);
  /* 4 searches from different roots (Graph500 runs 64); the last one is validated. */
  uint32_t root = 0;
  double t0 = now_s();
  size_t head = 0, tail = 0, edges = 0;
  for (int r = 0; r < 4; r++) {
    root = (uint32_t)(mix64(r + 11) % nv);
    while (off[root + 1] == off[root]) root = (root + 1) % nv;
    for (size_t v = 0; v < nv; v++) parent[v] = level[v] = -1;
    head = tail = 0;
    parent[root] = root; level[root] = 0; queue[tail++] = root;
    while (head < tail) {
      uint32_t u = queue[head++];
      for (uint64_t k = off[u]; k < off[u + 1]; k++, edges++) {
        uint32_t w = adj[k];
        if (parent[w] < 0) { parent[w] = u; level[w] = level[u] + 1; queue[tail++] = w; }
      }
    }
  }
  double secs = now_s() - t0;
  int ok = 1;
  for (size_t v = 0; v < nv && ok; v++) {
    if (parent[v] < 0) continue;
    if (v != root) {
      int found = 0;
      for (uint64_t k = off[v]; k < off[v + 1]; k++) found |= adj[k] == (uint32_t)parent[v];
      if (!found || level[v] != level[parent[v]] + 1) ok = 0;
    }
    for (uint64_t k = off[v]; k < off[v + 1]; k++) if (parent[adj[k]] < 0) ok = 0;
  }
  RESULT("bfs", ok, secs, "scale=%d visited=%zu TEPS=%.3e", scale, tail, edges / secs);
  return !ok;
}
