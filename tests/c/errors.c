/* Bad input gets a clear error and disturbs nothing. */
#define _GNU_SOURCE
#include <attune.h>
#include <string.h>
#include <errno.h>
#include "check.h"

int main(void) {
    uint64_t *keep = allocate_TM(4u << 20, ATTUNE_LAT);
    CHECK(keep != NULL, "alloc: %s", attune_last_error());
    for (size_t i = 0; i < (4u << 17); i++) keep[i] = mix64(i);
    char *small = allocate_TM(100, 0);
    CHECK(small != NULL, "small alloc");
    memset(small, 7, 100);

    errno = 0; CHECK(allocate_TM(0, 0) == NULL && errno == EINVAL, "size 0: errno %d", errno);
    errno = 0; CHECK(allocate_TM(1u << 20, 0x40) == NULL && errno == EINVAL, "unknown flags: errno %d", errno);
    CHECK(strstr(attune_last_error(), "flag") != NULL, "message names flags: %s", attune_last_error());
    errno = 0; CHECK(allocate_TM((size_t)1 << 62, ATTUNE_CAP) == NULL && errno == ENOMEM, "huge: errno %d", errno);
    errno = 0; CHECK(allocate_TM(SIZE_MAX, ATTUNE_CAP) == NULL && errno == ENOMEM, "SIZE_MAX: errno %d", errno);

    int on_stack;
    errno = 0; free_TM(&on_stack); CHECK(errno == EINVAL, "foreign pointer: errno %d", errno);
    errno = 0; CHECK(attune_free(&on_stack) == -1 && errno == EINVAL, "attune_free foreign");
    errno = 0; CHECK(attune_phase_end() == -1 && errno == EINVAL, "phase end with none open");
    errno = 0; CHECK(attune_phase_begin(NULL) == -1 && errno == EINVAL, "phase without a name");
    errno = 0; CHECK(attune_phase_begin("") == -1 && errno == EINVAL, "phase with an empty name");
    CHECK(attune_phase_begin("solve") == 0 && attune_phase_begin("next") == 0 && attune_phase_end() == 0, "phases");
    errno = 0; CHECK(attune_free((char *)keep + 4096) == -1 && errno == EINVAL, "interior pointer");
    CHECK(strstr(attune_last_error(), "inside") != NULL, "message: %s", attune_last_error());
    errno = 0; CHECK(attune_free(small + 8) == -1 && errno == EINVAL, "interior small pointer");
    /* 16-byte aligned, so only the live-block map can tell it from a block start. */
    errno = 0; CHECK(attune_free(small + 16) == -1 && errno == EINVAL, "aligned interior small pointer");
    errno = 0; free_TM(small + 32);
    CHECK(errno == EINVAL, "free_TM of an aligned interior small pointer sets EINVAL");
    CHECK(attune_free(NULL) == 0, "free(NULL) is a no-op");

    uint64_t *twice = allocate_TM(2u << 20, 0);
    CHECK(attune_free(twice) == 0, "first free");
    errno = 0; CHECK(attune_free(twice) == -1 && errno == EINVAL, "double free of a region");
    char *s2 = allocate_TM(64, ATTUNE_SHL);
    CHECK(attune_free(s2) == 0, "first small free");
    errno = 0; CHECK(attune_free(s2) == -1 && errno == EINVAL, "double free of a small block");
    /* The same through free_TM (its fast path), for a 1 KiB block. */
    char *s3 = allocate_TM(1024, 0);
    free_TM(s3);
    errno = 0; free_TM(s3);
    CHECK(errno == EINVAL, "free_TM twice of a small block sets EINVAL");

    errno = 0; CHECK(attune_set_flags(keep, 0x100) == -1 && errno == EINVAL, "set_flags bad bits");
    CHECK(attune_set_flags(keep, ATTUNE_CAP) == 0, "set_flags");
    attune_region_stats_t st;
    CHECK(attune_region_stats(keep, &st) == 0 && st.flags == ATTUNE_CAP, "flags changed");
    errno = 0; CHECK(attune_region_stats(&on_stack, &st) == -1 && errno == EINVAL, "stats foreign");
    errno = 0; CHECK(attune_pin(keep, (size_t)1 << 40) == -1 && errno == EINVAL, "pin beyond allocation");
    /* Pinning more than the DRAM budget (16 MiB in the test run) is refused, not partial. */
    uint64_t *big = allocate_TM(48u << 20, 0);
    errno = 0; CHECK(big && attune_pin(big, 32u << 20) == -1 && errno == ENOMEM, "oversize pin: errno %d", errno);
    CHECK(strstr(attune_last_error(), "budget") != NULL, "message names the budget: %s", attune_last_error());
    attune_region_stats_t bs;
    CHECK(attune_region_stats(big, &bs) == 0 && bs.pinned_bytes == 0, "nothing pinned after a refused pin");
    free_TM(big);
    errno = 0; CHECK(attune_prefetch(&on_stack, 8) == -1 && errno == EINVAL, "prefetch foreign");
    attune_alloc_opts o = {0};
    errno = 0; CHECK(attune_alloc(1u << 20, &o) == NULL && errno == EINVAL, "uninitialised opts");
    attune_alloc_opts_init(&o); o.chunk_size = 3000;
    errno = 0; CHECK(attune_alloc(1u << 20, &o) == NULL && errno == EINVAL, "bad chunk size");
    CHECK(attune_tier_stats(99, NULL) == -1 && errno == EINVAL, "bad tier index");
    CHECK(strlen(attune_strerror(ENOMEM)) > 0, "strerror");

    /* Nothing else was disturbed. */
    uint64_t bad = 0;
    for (size_t i = 0; i < (4u << 17); i++) bad += keep[i] != mix64(i);
    CHECK(bad == 0, "%lu words of a live allocation changed", bad);
    for (int i = 0; i < 100; i++) bad += small[i] != 7;
    CHECK(bad == 0, "small block changed");
    free_TM(keep); free_TM(small);
    CHECK_DONE();
}
