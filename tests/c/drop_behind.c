/* Drop-behind for streamed (BW) regions: a loop over more than the budget keeps a fixed
 * part resident and misses only on the shortfall, where replacement by age misses on
 * more. Two 32 MiB regions on a 16 MiB budget, each summed in 6 passes on its own (64 KiB
 * chunks, read-ahead on): a BW region and an unflagged one. The BW loop must fetch at
 * most 3/4 of what the unflagged loop fetches, its chunks must have gone from behind the
 * stream (the engine's dropped_behind_bytes), and every value must be intact.
 * CAP data gives way first: 32 MiB of CAP data written after an 8 MiB working array
 * must leave the array resident (the CAP region's own older chunks go), where
 * replacement by age evicts the older array.
 * Under ATTUNE_MODE=temperature (flags ignored) the test only checks the values. */
#define _GNU_SOURCE
#include <attune.h>
#include <string.h>
#include "check.h"
#include "engine_stats.h"

/* Fetched bytes of 6 summing passes over a fresh region of `flags`. */
static uint64_t loop(int flags, const char *what) {
    const int MIB = (int)env_size("DROP_MIB", 32), PASSES = 6;
    size_t words = (size_t)MIB << 17;
    attune_alloc_opts o; attune_alloc_opts_init(&o);
    o.flags = flags; o.chunk_size = 64 << 10;
    uint64_t *a = attune_alloc(words * 8, &o);
    CHECK(a != NULL, "%s: alloc: %s", what, attune_last_error());
    if (!a) return 0;
    for (size_t i = 0; i < words; i++) a[i] = mix64(i);
    uint64_t want = 0;
    for (size_t i = 0; i < words; i++) want += mix64(i);
    attune_region_stats_t s0, s1;
    attune_region_stats(a, &s0);
    int bad = 0;
    for (int p = 0; p < PASSES; p++) {
        uint64_t sum = 0;
        for (size_t i = 0; i < words; i++) sum += a[i];
        bad += sum != want;
    }
    attune_region_stats(a, &s1);
    CHECK(bad == 0, "%s: %d passes summed wrong", what, bad);
    uint64_t fetched = s1.fetched_bytes - s0.fetched_bytes;
    printf("%s: %d passes over %d MiB fetched %.1f MiB\n", what, PASSES, MIB, fetched / 1048576.0);
    attune_free(a);
    return fetched;
}

/* Resident bytes of an 8 MiB working array after 32 MiB of CAP data were written behind it. */
static uint64_t cap_after_array(void) {
    size_t wwords = (size_t)8 << 17, cwords = (size_t)32 << 17;
    attune_alloc_opts o; attune_alloc_opts_init(&o);
    o.chunk_size = 64 << 10;
    uint64_t *w = attune_alloc(wwords * 8, &o);
    o.flags = ATTUNE_CAP;
    uint64_t *cap = attune_alloc(cwords * 8, &o);
    CHECK(w && cap, "alloc: %s", attune_last_error());
    if (!w || !cap) return 0;
    for (size_t i = 0; i < wwords; i++) w[i] = mix64(i);
    for (size_t i = 0; i < cwords; i++) cap[i] = mix64(i) ^ 7;
    attune_region_stats_t s;
    attune_region_stats(w, &s);
    uint64_t resident = s.resident_bytes;
    int bad = 0;
    for (size_t i = 0; i < wwords; i++) bad += w[i] != mix64(i);
    for (size_t i = 0; i < cwords; i++) bad += cap[i] != (mix64(i) ^ 7);
    CHECK(bad == 0, "CAP after array: %d wrong values", bad);
    printf("CAP after array: array resident %.1f of 8 MiB\n", resident / 1048576.0);
    attune_free(w);
    attune_free(cap);
    return resident;
}

int main(void) {
    const char *mode = getenv("ATTUNE_MODE");
    int attuned = !(mode && strcmp(mode, "temperature") == 0);
    uint64_t d0 = engine_counter("dropped_behind_bytes");
    uint64_t bw = loop(ATTUNE_BW, "BW");
    uint64_t d1 = engine_counter("dropped_behind_bytes");
    uint64_t plain = loop(0, "unflagged");
    uint64_t d2 = engine_counter("dropped_behind_bytes");
    uint64_t kept = cap_after_array();
    CHECK(d0 != UINT64_MAX, "dropped_behind_bytes in attune_stats_json");
    CHECK(d2 == d1, "an unflagged loop dropped %llu bytes behind", (unsigned long long)(d2 - d1));
    if (attuned) {
        CHECK(d1 > d0, "the BW loop dropped nothing behind");
        CHECK(plain > 0 && bw * 4 <= plain * 3, "BW loop fetched %llu bytes, unflagged %llu (at most 3/4 expected)",
              (unsigned long long)bw, (unsigned long long)plain);
        CHECK(kept >= (7u << 20), "CAP data written after an 8 MiB array left %llu bytes of it resident",
              (unsigned long long)kept);
    } else {
        CHECK(d1 == d0, "temperature-only mode dropped %llu bytes behind", (unsigned long long)(d1 - d0));
    }
    CHECK_DONE();
}
