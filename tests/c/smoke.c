#include <attune.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
int main(void) {
    size_t n = 64u << 20;
    uint64_t *a = allocate_TM(n, ATTUNE_BW);
    if (!a) { printf("alloc failed: %s\n", attune_last_error()); return 1; }
    size_t words = n / 8;
    for (size_t i = 0; i < words; i++) a[i] = i * 2654435761u;
    uint64_t bad = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < words; i++) if (a[i] != i * 2654435761u) bad++;
    attune_region_stats_t s; attune_region_stats(a, &s);
    printf("bad=%lu resident=%lu far=%lu faults=%lu evictions=%lu\n", bad, s.resident_bytes, s.tier_bytes[1], s.faults, s.evictions);
    char buf[4096]; attune_stats_json(buf, sizeof buf); printf("%s\n", buf);
    /* No NUMA tier configured here: the "numa" object is null (the QEMU guest test checks
       it with one). */
    int numa_null = strstr(buf, "\"numa\":null") != NULL;
    if (!numa_null) printf("attune_stats_json: no \"numa\":null without NUMA tiers\n");
    free_TM(a);
    return bad != 0 || !numa_null;
}
