/* The file tier's file of this process, for tests that damage it behind the runtime's
 * back (lost_tier.c, tests/run/fixed_lost.c). */
#ifndef ATTUNE_TEST_TIER_FILE_H
#define ATTUNE_TEST_TIER_FILE_H
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The runtime's tier file: an unnamed file (O_TMPFILE) in dir, seen as "dir/#N (deleted)";
 * -1 if there is none. */
static int tier_fd(const char *dir) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    struct dirent *e;
    int found = -1;
    size_t dl = strlen(dir);
    while ((e = readdir(d)) != NULL) {
        char path[300], link[4096];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n <= 0) continue;
        link[n] = 0;
        if (strncmp(link, dir, dl) == 0 && link[dl] == '/' && strstr(link, "(deleted)"))
            found = atoi(e->d_name);
    }
    closedir(d);
    return found;
}
#endif
