/* A mixed workflow for the placement benchmark (issue: application-attuned placement):
 *   - a LAT lookup table, 5% of the footprint, read at random (latency measured);
 *   - BW arrays, 50% of the footprint, streamed every iteration (c = a + b);
 *   - CAP data, the other 45%, written once and touched rarely.
 * Every value is checked, so a run under pressure that loses or corrupts a page fails.
 * Usage: mixed FOOTPRINT_MIB ITERATIONS LOOKUPS_PER_ITERATION
 * Prints: mixed: OK seconds=S lookup_p50_ns=N lookup_p99_ns=N ...
 */
#include <attune.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static uint64_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Per-region counters on stderr (totals since allocation), at the start of the timed loop
 * and at the end: the difference is what the loop moved. */
static void print_regions(const char *when, void *regions[5]) {
    static const char *names[5] = {"lat", "a", "b", "c", "cap"};
    attune_region_stats_t st;
    for (int k = 0; k < 5; k++) {
        if (attune_region_stats(regions[k], &st) != 0) continue;
        fprintf(stderr, "mixed: %s region %s chunk %llu faults %llu fetched_mib %llu evictions %llu resident_mib %llu\n",
                when, names[k], (unsigned long long)st.chunk_size, (unsigned long long)st.faults,
                (unsigned long long)(st.fetched_bytes >> 20), (unsigned long long)st.evictions,
                (unsigned long long)(st.resident_bytes >> 20));
    }
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s FOOTPRINT_MIB ITERATIONS LOOKUPS\n", argv[0]); return 2; }
    size_t mib = strtoull(argv[1], 0, 10), iters = strtoull(argv[2], 0, 10), lookups = strtoull(argv[3], 0, 10);
    size_t total = mib << 20;
    size_t lat_n = total / 20 / 8, bw_n = total / 2 / 3 / 8, cap_n = (total - lat_n * 8 - bw_n * 24) / 8;
    uint64_t *lat = allocate_TM(lat_n * 8, ATTUNE_LAT);
    double *a = allocate_TM(bw_n * 8, ATTUNE_BW), *b = allocate_TM(bw_n * 8, ATTUNE_BW),
           *c = allocate_TM(bw_n * 8, ATTUNE_BW);
    uint64_t *cap = allocate_TM(cap_n * 8, ATTUNE_CAP);
    if (!lat || !a || !b || !c || !cap) { perror("allocate_TM"); return 1; }
    for (size_t i = 0; i < lat_n; i++) lat[i] = mix(i);
    for (size_t i = 0; i < bw_n; i++) { a[i] = (double)(i & 1023); b[i] = 2.0 * (double)(i & 1023); }
    for (size_t i = 0; i < cap_n; i++) cap[i] = mix(i) ^ 0xcafe;
    const size_t group = 8; /* lookups per timed group: the clock costs ~20 ns */
    size_t ngroups = lookups / group;
    double *lat_ns = malloc(sizeof(double) * ngroups * iters);
    size_t nl = 0, bad = 0;
    uint64_t rng = 12345;
    attune_region_stats_t st;
    void *regions[5] = {lat, a, b, c, cap};
    print_regions("loop-start", regions);
    uint64_t faults0 = attune_region_stats(lat, &st) == 0 ? st.faults : 0;
    double t0 = now();
    for (size_t it = 0; it < iters; it++) {
        double s = 0;
        for (size_t i = 0; i < bw_n; i++) { c[i] = a[i] + b[i]; s += c[i]; }
        double want = 0;
        for (size_t i = 0; i < 1024; i++) want += 3.0 * i;
        want *= (double)(bw_n / 1024);
        for (size_t i = bw_n / 1024 * 1024; i < bw_n; i++) want += 3.0 * (double)(i & 1023);
        if (s != want) bad++;
        for (size_t g = 0; g < ngroups; g++) {
            double t = now();
            for (size_t k = 0; k < group; k++) {
                rng = mix(rng + 1);
                size_t i = rng % lat_n;
                if (lat[i] != mix(i)) bad++;
            }
            lat_ns[nl++] = (now() - t) * 1e9 / group;
        }
        for (size_t k = 0; k < 16; k++) { /* CAP: a few pages per iteration */
            rng = mix(rng + 7);
            size_t i = rng % cap_n;
            if (cap[i] != (mix(i) ^ 0xcafe)) bad++;
        }
    }
    double secs = now() - t0;
    double lookup_s = 0;
    for (size_t i = 0; i < nl; i++) lookup_s += lat_ns[i] * group * 1e-9;
    qsort(lat_ns, nl, sizeof(double), cmp);
    uint64_t lat_faults = attune_region_stats(lat, &st) == 0 ? st.faults - faults0 : 0;
    if (bad) { printf("mixed: FAILED %zu wrong values\n", bad); return 1; }
    printf("mixed: OK seconds=%.3f lookup_p50_ns=%.0f lookup_p99_ns=%.0f lat_faults_in_loop=%llu "
           "lookup_p999_ns=%.0f lookup_seconds=%.3f footprint_mib=%zu\n",
           secs, lat_ns[nl / 2], lat_ns[nl * 99 / 100], (unsigned long long)lat_faults,
           lat_ns[nl * 999 / 1000], lookup_s, mib);
    /* Per-region counters on stderr: which arrays the replacement kept and which it cycled. */
    print_regions("end", regions);
    free_TM(lat); free_TM(a); free_TM(b); free_TM(c); free_TM(cap);
    return 0;
}
