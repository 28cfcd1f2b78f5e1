/* attune run test: a program linked with its own allocator (build with -DUSE_JEMALLOC
 * -ljemalloc, -DUSE_TCMALLOC -ltcmalloc or -DUSE_MIMALLOC -lmimalloc). Small objects,
 * large arrays several times the budget, every malloc-family entry, realloc across the
 * threshold, four threads, and the allocator's own API, on its own blocks and (jemalloc,
 * tcmalloc) on large blocks from malloc that the runtime manages. Every buffer is
 * verified. Usage: allocators MiB. Prints "allocators: OK".
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(USE_JEMALLOC)
#include <jemalloc/jemalloc.h>
#define LIB "jemalloc"
#elif defined(USE_TCMALLOC)
#include <gperftools/malloc_extension_c.h>
#include <gperftools/tcmalloc.h>
#define LIB "tcmalloc"
#elif defined(USE_MIMALLOC)
#include <mimalloc.h>
#define LIB "mimalloc"
#else
#define LIB "glibc"
#endif

static int bad;
#define CHECK(c, ...) do { if (!(c)) { bad++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static uint64_t mix(uint64_t x) { x ^= x >> 31; x *= 0x9E3779B97F4A7C15ull; return x ^ (x >> 29); }
static void fill(uint64_t *p, size_t n, uint64_t seed) { for (size_t i = 0; i < n; i++) p[i] = mix(i + seed); }
static size_t check(const uint64_t *p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) if (p[i] != mix(i + seed)) return i + 1;
  return 0;
}

/* Small objects: a table of strings, half freed and reallocated, all checked. */
static void small_objects(uint64_t seed) {
  enum { N = 50000 };
  char **s = malloc(N * sizeof *s);
  CHECK(s, "table");
  char buf[64];
  for (int i = 0; i < N; i++) { snprintf(buf, sizeof buf, "k%llu", (unsigned long long)mix(i + seed)); s[i] = strdup(buf); }
  for (int i = 0; i < N; i += 2) { s[i] = realloc(s[i], 48); strcat(s[i], "+"); }
  for (int i = 0; i < N; i++) {
    snprintf(buf, sizeof buf, "k%llu%s", (unsigned long long)mix(i + seed), i % 2 ? "" : "+");
    if (strcmp(s[i], buf)) { CHECK(0, "small object %d", i); break; }
    CHECK(malloc_usable_size(s[i]) >= strlen(buf) + 1, "usable size of a small object");
    free(s[i]);
  }
  free(s);
}

struct big { uint64_t *p; size_t n; uint64_t seed; };

/* Large blocks from every entry of the malloc family, filled and checked after the whole
 * footprint went by (so most came back from a far tier). */
static void large_blocks(size_t mib) {
  size_t n = (mib << 20) / 8 / 8;
  struct big b[8];
  void *v = NULL;
  b[0].p = malloc(n * 8);
  b[1].p = calloc(n, 8);
  b[2].p = memalign(4096, n * 8);
  CHECK(posix_memalign(&v, 64, n * 8) == 0, "posix_memalign"); b[3].p = v;
  b[4].p = aligned_alloc(4096, n * 8);
  b[5].p = valloc(n * 8);
#ifdef USE_JEMALLOC
  b[6].p = valloc(n * 8); /* jemalloc has no pvalloc: glibc's would be mixed with it */
#else
  b[6].p = pvalloc(n * 8 - 100);
#endif
  b[7].p = malloc(1 << 16);
  for (int k = 0; k < 8; k++) { b[k].n = n; b[k].seed = (uint64_t)k * n; CHECK(b[k].p, "large block %d", k); if (!b[k].p) return; }
  b[7].n = (1 << 16) / 8;
  for (size_t i = 0; i < n; i++) CHECK(b[1].p[i] == 0 || (i = n), "calloc not zero");
  CHECK((uintptr_t)b[2].p % 4096 == 0 && (uintptr_t)b[3].p % 64 == 0 && (uintptr_t)b[4].p % 4096 == 0, "alignment");
  CHECK((uintptr_t)b[5].p % 4096 == 0 && (uintptr_t)b[6].p % 4096 == 0, "page alignment");
  for (int k = 0; k < 8; k++) { fill(b[k].p, b[k].n, b[k].seed); CHECK(malloc_usable_size(b[k].p) >= b[k].n * 8, "usable size %d", k); }
  /* A small block grows past the threshold (into managed memory) and keeps its data. */
  for (int step = 0; step < 6; step++) {
    size_t old = b[7].n;
    b[7].p = realloc(b[7].p, old * 2 * 8);
    CHECK(b[7].p, "realloc");
    if (!b[7].p) return;
    CHECK(check(b[7].p, old, b[7].seed) == 0, "realloc lost data at step %d", step);
    b[7].n = old * 2;
    fill(b[7].p, b[7].n, b[7].seed);
  }
  for (int k = 0; k < 8; k++) CHECK(check(b[k].p, b[k].n, b[k].seed) == 0, "large block %d corrupted", k);
  /* Shrinking keeps the front. */
  b[0].p = realloc(b[0].p, n * 4);
  CHECK(b[0].p && check(b[0].p, n / 2, b[0].seed) == 0, "realloc shrink");
  for (int k = 0; k < 8; k++) free(b[k].p);
}

static void *worker(void *arg) {
  uint64_t seed = (uintptr_t)arg;
  for (int r = 0; r < 20; r++) {
    size_t n = ((r % 3) ? 1000 : (3 << 20)) / 8;
    uint64_t *p = malloc(n * 8);
    CHECK(p, "thread malloc");
    if (!p) return NULL;
    fill(p, n, seed + r);
    char *s = strdup("thread small object");
    CHECK(check(p, n, seed + r) == 0, "thread block");
    CHECK(!strcmp(s, "thread small object"), "thread string");
    free(s);
    free(p);
  }
  small_objects(seed);
  return NULL;
}

/* The allocator's own API: on its own blocks and on a large block from malloc. */
static void allocator_api(size_t mib) {
  size_t n = (mib << 20) / 8 / 4;
#if defined(USE_JEMALLOC)
  uint64_t epoch = 1; size_t sz = sizeof epoch, allocated = 0;
  CHECK(mallctl("epoch", &epoch, &sz, &epoch, sz) == 0, "mallctl epoch");
  sz = sizeof allocated;
  CHECK(mallctl("stats.allocated", &allocated, &sz, NULL, 0) == 0 && allocated > 0, "mallctl stats.allocated = %zu", allocated);
  char *z = mallocx(1000, MALLOCX_ZERO);
  CHECK(z && z[999] == 0 && sallocx(z, 0) >= 1000, "mallocx");
  z = rallocx(z, 5000, 0);
  CHECK(z && sallocx(z, 0) >= 5000, "rallocx");
  dallocx(z, 0);
  uint64_t *big = malloc(n * 8);
  fill(big, n, 77);
  CHECK(sallocx(big, 0) >= n * 8, "sallocx of a large malloc block");
  CHECK(xallocx(big, n * 8, 0, 0) >= n * 8, "xallocx of a large malloc block");
  big = rallocx(big, n * 16, 0);
  CHECK(big && check(big, n, 77) == 0, "rallocx of a large malloc block");
  sdallocx(big, n * 16, 0);
  uint64_t *big2 = malloc(n * 8);
  fill(big2, n, 78);
  CHECK(check(big2, n, 78) == 0, "large block");
  dallocx(big2, 0);
#elif defined(USE_TCMALLOC)
  size_t v = 0;
  CHECK(MallocExtension_GetNumericProperty("generic.current_allocated_bytes", &v) && v > 0, "tcmalloc allocated bytes %zu", v);
  char *t = tc_malloc(1000);
  CHECK(t && tc_malloc_size(t) >= 1000, "tc_malloc");
  tc_free(t);
  uint64_t *big = malloc(n * 8);
  fill(big, n, 77);
  CHECK(tc_malloc_size(big) >= n * 8, "tc_malloc_size of a large malloc block");
  big = tc_realloc(big, n * 16);
  CHECK(big && check(big, n, 77) == 0, "tc_realloc of a large malloc block");
  tc_free(big);
  MallocExtension_ReleaseFreeMemory();
#elif defined(USE_MIMALLOC)
  CHECK(mi_version() > 0, "mi_version");
  uint64_t *m = mi_malloc(n * 8);
  CHECK(m && mi_usable_size(m) >= n * 8, "mi_malloc");
  fill(m, n, 79);
  m = mi_realloc(m, n * 16);
  CHECK(m && check(m, n, 79) == 0, "mi_realloc");
  mi_free(m);
  char *s = mi_strdup("mimalloc string");
  CHECK(s && !strcmp(s, "mimalloc string"), "mi_strdup");
  free(s); /* free() of mi_malloc's block: the program's allocator takes it back */
  mi_collect(true);
#else
  (void)n;
#endif
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 96;
  small_objects(1);
  large_blocks(mib);
  pthread_t th[4];
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)(1000 * (i + 1)));
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  allocator_api(mib);
  if (bad) { printf("allocators: %d FAILED (%s)\n", bad, LIB); return 1; }
  printf("allocators: OK (%s)\n", LIB);
  return 0;
}
