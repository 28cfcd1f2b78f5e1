/* A program with a known access distribution: HOT% of its pages take SHARE% of its
 * random accesses (default 10% and 90%), for SECONDS seconds, then an integrity check
 * (every access adds 1 to a word; the sum must equal the number of accesses).
 * With PHASES=1 in the environment: first a "uniform" phase (every page alike) for the
 * same time, then the "skewed" phase, marked with attune_phase_begin/end (weak symbols:
 * present under `attune profile`, absent otherwise).
 *   skewed MIB SECONDS [HOT_PERCENT SHARE_PERCENT]                                    */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int attune_phase_begin(const char *name) __attribute__((weak));
int attune_phase_end(void) __attribute__((weak));

static void phase(const char *name) {
    if (name && attune_phase_begin) attune_phase_begin(name);
    if (!name && attune_phase_end) attune_phase_end();
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: skewed MIB SECONDS [HOT_PERCENT SHARE_PERCENT]\n");
        return 2;
    }
    size_t mib = strtoul(argv[1], 0, 10);
    double secs = atof(argv[2]);
    double hot = argc > 3 ? atof(argv[3]) / 100 : 0.10, share = argc > 4 ? atof(argv[4]) / 100 : 0.90;
    size_t words = mib << 17, pages = words / 512;
    size_t hot_pages = (size_t)(pages * hot);
    uint64_t *a = malloc(words * 8);
    if (!a || hot_pages == 0 || hot_pages >= pages) {
        fprintf(stderr, "skewed: bad sizes\n");
        return 2;
    }
    for (size_t i = 0; i < words; i++) a[i] = 0;
    uint64_t x = 88172645463325252ull, n = 0;
    if (getenv("PHASES")) {
        phase("uniform");
        double end = now() + secs;
        while (now() < end) {
            for (int k = 0; k < 4096; k++) {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                a[((x >> 32) % pages) * 512 + ((x >> 20) & 511)] += 1;
                n++;
            }
        }
        phase(NULL);
        phase("skewed");
    }
    uint32_t cut = (uint32_t)(share * 4294967295.0);
    double end = now() + secs;
    while (now() < end) {
        for (int k = 0; k < 4096; k++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            size_t page = ((uint32_t)x < cut) ? (x >> 32) % hot_pages
                                              : hot_pages + (x >> 32) % (pages - hot_pages);
            a[page * 512 + ((x >> 20) & 511)] += 1;
            n++;
        }
    }
    if (getenv("PHASES")) phase(NULL);
    uint64_t sum = 0;
    for (size_t i = 0; i < words; i++) sum += a[i];
    if (sum != n) {
        printf("skewed: CORRUPT sum %llu != accesses %llu\n", (unsigned long long)sum, (unsigned long long)n);
        return 1;
    }
    printf("skewed: OK accesses=%llu pages=%zu hot_pages=%zu\n", (unsigned long long)n, pages, hot_pages);
    free(a);
    return 0;
}
