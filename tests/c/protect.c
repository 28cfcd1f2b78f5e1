/* Placement under pressure (IMME Algorithm 2): a LAT region in the same process as a CAP
 * region four times the DRAM budget keeps its pages; fault counts prove it. Run with
 * ATTUNE_MODE=temperature and EXPECT_LAT_FAULTS=1, the same program must see the LAT
 * pages evicted (so the check can fail). Also: a hot set that starts in the far tier is
 * resident after one pass (promotion on first touch) and faults no more.
 * Usage: protect (budget from ATTUNE_DRAM, TEST_BUDGET in bytes) */
#include <attune.h>
#include <string.h>
#include "check.h"

int main(void) {
    size_t budget = env_size("TEST_BUDGET", 16u << 20);
    int expect_faults = getenv("EXPECT_LAT_FAULTS") != NULL;
    size_t lat_n = budget / 4 / 8, cap_n = budget * 4 / 8;
    uint64_t *lat = allocate_TM(lat_n * 8, ATTUNE_LAT);
    uint64_t *cap = allocate_TM(cap_n * 8, ATTUNE_CAP);
    CHECK(lat && cap, "allocation failed");
    if (!lat || !cap) CHECK_DONE();
    for (size_t i = 0; i < lat_n; i++) lat[i] = mix64(i);
    attune_region_stats_t s0, s1;
    CHECK(attune_region_stats(lat, &s0) == 0, "stats");
    /* Pressure: stream the CAP region (4x the budget) three times, reading LAT between. */
    uint64_t bad = 0;
    for (int pass = 0; pass < 3; pass++) {
        for (size_t i = 0; i < cap_n; i += 512) cap[i] = mix64(i + pass);
        for (size_t i = 0; i < lat_n; i += 512) bad += lat[i] != mix64(i);
    }
    CHECK(attune_region_stats(lat, &s1) == 0, "stats");
    uint64_t lat_faults = s1.faults - s0.faults;
    CHECK(bad == 0, "%llu wrong LAT values", (unsigned long long)bad);
    if (expect_faults)
        CHECK(lat_faults > 0, "temperature-only mode should have evicted LAT pages");
    else
        CHECK(lat_faults == 0 && s1.evictions == 0, "LAT region faulted %llu times, %llu evictions",
              (unsigned long long)lat_faults, (unsigned long long)s1.evictions);
    /* A hot set of the CAP region that was evicted: one pass brings it in, the next
     * passes do not fault. */
    size_t hot_n = budget / 16 / 8;
    for (size_t i = 0; i < hot_n; i += 512) bad += cap[i] != mix64(i + 2);
    attune_region_stats_t c0, c1;
    attune_region_stats(cap, &c0);
    for (int pass = 0; pass < 5; pass++)
        for (size_t i = 0; i < hot_n; i += 512) bad += cap[i] != mix64(i + 2);
    attune_region_stats(cap, &c1);
    CHECK(bad == 0, "wrong CAP values");
    CHECK(c1.faults == c0.faults, "hot set faulted %llu more times after its first pass",
          (unsigned long long)(c1.faults - c0.faults));
    printf("protect: LAT faults under pressure %llu, evictions %llu; CAP evictions %llu\n",
           (unsigned long long)lat_faults, (unsigned long long)s1.evictions,
           (unsigned long long)c1.evictions);
    free_TM(lat); free_TM(cap);
    CHECK_DONE();
}
