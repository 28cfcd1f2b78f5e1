/* One instance of an ensemble at its cold start: it brings its input into memory and
 * reads all of it (bench/staging.py).
 *
 *   stage_reader -      read standard input to its end into its own memory (an input
 *                       fetched from the store by each instance)
 *   stage_reader PATH   map PATH read-only (a staged input, or a node-local copy)
 *
 * Prints the input's bytes and a checksum of its 8-byte words, which the benchmark
 * compares with the source's. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t checksum(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 1099511628211ull;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: stage_reader -|PATH\n");
        return 2;
    }
    unsigned char *p;
    size_t n = 0;
    if (!strcmp(argv[1], "-")) {
        size_t cap = 1 << 20;
        p = malloc(cap);
        for (;;) {
            if (n == cap) {
                cap *= 2;
                p = realloc(p, cap);
            }
            if (!p) {
                perror("stage_reader: malloc");
                return 1;
            }
            ssize_t r = read(0, p + n, cap - n);
            if (r < 0) {
                perror("stage_reader: read");
                return 1;
            }
            if (r == 0) break;
            n += (size_t)r;
        }
    } else {
        int fd = open(argv[1], O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) {
            perror(argv[1]);
            return 1;
        }
        n = (size_t)st.st_size;
        p = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            perror("stage_reader: mmap");
            return 1;
        }
    }
    printf("%zu %016llx\n", n, (unsigned long long)checksum(p, n));
    return 0;
}
