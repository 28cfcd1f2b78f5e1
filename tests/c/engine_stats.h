/* An engine counter of the running process, from attune_stats_json's "engine" object
 * (UINT64_MAX when it is missing). For the tests that check who evicted what. */
#ifndef ATTUNE_TEST_ENGINE_STATS_H
#define ATTUNE_TEST_ENGINE_STATS_H
#include <attune.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static inline uint64_t engine_counter(const char *name) {
    static char buf[8192];
    attune_stats_json(buf, sizeof buf);
    char key[64];
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *e = strstr(buf, "\"engine\":");
    const char *k = e ? strstr(e, key) : NULL;
    return k ? strtoull(k + strlen(key), NULL, 10) : UINT64_MAX;
}
#endif
