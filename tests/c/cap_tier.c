/* Where CAP data lives (Pager::home_tier in paging/ops.rs, docs/design/evaluation.md "CAP's tier"): on the biggest
 * far tier that is memory, a file tier only as overflow or when there is no memory tier;
 * unflagged data on the fastest far tier. EXPECT says which configuration runs:
 *   memory    memory and file tiers with room: CAP's far bytes all in the memory tier;
 *   overflow  a memory tier of MEM_CAP bytes: CAP fills it, the rest goes to the file;
 *   file      a file tier only: CAP there.
 * Every word is checked after the placement is read. */
#include <attune.h>
#include <string.h>
#include "check.h"

static int tier_of_kind(const char *kind) {
    attune_tier_stats_t t;
    for (int i = 1; attune_tier_stats(i, &t) == 0; i++)
        if (strcmp(t.kind, kind) == 0) return i;
    return -1;
}

static void far_bytes(void *p, uint64_t *mem, uint64_t *file, int mi, int fi) {
    attune_region_stats_t s;
    *mem = *file = 0;
    if (attune_region_stats(p, &s) != 0) return;
    if (mi > 0) *mem = s.tier_bytes[mi];
    if (fi > 0) *file = s.tier_bytes[fi];
}

int main(void) {
    const char *expect = getenv("EXPECT") ? getenv("EXPECT") : "memory";
    size_t len = env_size("CAP_BYTES", 48u << 20), words = len / 8;
    size_t budget = env_size("TEST_BUDGET", 16u << 20);
    uint64_t *cap = allocate_TM(len, ATTUNE_CAP);
    CHECK(cap != NULL, "allocate_TM: %s", attune_last_error());
    if (!cap) CHECK_DONE();
    for (size_t i = 0; i < words; i++) cap[i] = mix64(i);
    int mi = tier_of_kind("memory"), fi = tier_of_kind("file");
    uint64_t mem, file;
    far_bytes(cap, &mem, &file, mi, fi);
    printf("cap_tier: %s: memory tier %d holds %llu, file tier %d holds %llu\n", expect, mi,
           (unsigned long long)mem, fi, (unsigned long long)file);
    /* At least what cannot be resident is far. */
    CHECK(mem + file >= len - budget, "only %llu far bytes", (unsigned long long)(mem + file));
    if (strcmp(expect, "memory") == 0) {
        CHECK(mi > 0 && fi > 0, "needs a memory and a file tier");
        CHECK(file == 0, "CAP data on the file tier while the memory tier had room: %llu",
              (unsigned long long)file);
    } else if (strcmp(expect, "overflow") == 0) {
        size_t mem_cap = env_size("MEM_CAP", 8u << 20);
        CHECK(mem > 0 && mem <= mem_cap, "memory tier holds %llu (capacity %zu)",
              (unsigned long long)mem, mem_cap);
        CHECK(file > 0, "nothing overflowed to the file tier");
    } else {
        CHECK(mi < 0 && fi > 0 && file > 0, "CAP data not on the only (file) tier");
    }
    /* Unflagged data goes to the fastest far tier (index 1). */
    uint64_t *plain = allocate_TM(len, 0);
    CHECK(plain != NULL, "allocate_TM: %s", attune_last_error());
    if (plain) {
        for (size_t i = 0; i < words; i++) plain[i] = ~mix64(i);
        attune_region_stats_t s;
        CHECK(attune_region_stats(plain, &s) == 0, "stats");
        uint64_t far = 0;
        for (uint32_t t = 2; t < s.ntiers; t++) far += s.tier_bytes[t];
        if (strcmp(expect, "memory") == 0)
            CHECK(far == 0 && s.tier_bytes[1] > 0, "unflagged data beyond the fastest far tier");
        size_t bad = 0;
        for (size_t i = 0; i < words; i++) bad += plain[i] != ~mix64(i);
        CHECK(bad == 0, "%zu wrong unflagged words", bad);
        free_TM(plain);
    }
    size_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += cap[i] != mix64(i);
    CHECK(bad == 0, "%zu wrong CAP words", bad);
    free_TM(cap);
    CHECK_DONE();
}
