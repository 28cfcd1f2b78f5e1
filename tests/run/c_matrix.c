/* attune run test: a plain C program (no Attune API) whose footprint is several times
 * the budget. malloc, calloc, realloc growth, posix_memalign and a large anonymous mmap;
 * every buffer is verified. Prints VmHWM so the test can check the budget from outside
 * the runtime's own accounting. Usage: c_matrix MiB */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <malloc.h>

static uint64_t mix(uint64_t x) { x ^= x >> 31; x *= 0x9E3779B97F4A7C15ull; return x ^ (x >> 29); }

static long hwm_kib(void) {
  FILE *f = fopen("/proc/self/status", "r"); char line[256]; long v = -1;
  while (f && fgets(line, sizeof line, f)) if (!strncmp(line, "VmHWM:", 6)) v = atol(line + 6);
  if (f) fclose(f);
  return v;
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 128, n = (mib << 20) / 8 / 4;
  int bad = 0;
  uint64_t *a = malloc(n * 8), *b = calloc(n, 8), *c = NULL, *d = mmap(NULL, n * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (!a || !b || d == MAP_FAILED || posix_memalign((void **)&c, 4096, n * 8)) { puts("alloc failed"); return 2; }
  if (malloc_usable_size(a) < n * 8) { puts("usable size too small"); bad++; }
  for (size_t i = 0; i < n; i++) { if (b[i]) { bad++; break; } }
  for (size_t i = 0; i < n; i++) { a[i] = mix(i); b[i] = mix(i + n); c[i] = mix(i + 2 * n); d[i] = mix(i + 3 * n); }
  /* realloc growth keeps the contents */
  uint64_t *g = malloc(1 << 20);
  size_t gn = (1 << 20) / 8;
  for (size_t i = 0; i < gn; i++) g[i] = mix(i * 7);
  for (int k = 0; k < 5; k++) {
    g = realloc(g, (gn * 2) * 8);
    for (size_t i = gn; i < gn * 2; i++) g[i] = mix(i * 7);
    gn *= 2;
  }
  for (size_t i = 0; i < gn; i++) if (g[i] != mix(i * 7)) { bad++; break; }
  /* random re-reads after the whole footprint went by */
  uint64_t s = 1;
  for (size_t k = 0; k < 20000; k++) {
    s = mix(s); size_t i = s % n;
    if (a[i] != mix(i) || b[i] != mix(i + n) || c[i] != mix(i + 2 * n) || d[i] != mix(i + 3 * n)) { bad++; break; }
  }
  munmap(d, n * 8); free(a); free(b); free(c); free(g);
  printf("c_matrix: %s footprint=%zu MiB VmHWM_KiB=%ld\n", bad ? "BAD" : "OK", mib + (gn * 8 >> 20), hwm_kib());
  return bad ? 1 : 0;
}
