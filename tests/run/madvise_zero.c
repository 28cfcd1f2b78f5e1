/* An unmodified program that gives memory back with madvise(MADV_DONTNEED) and relies on
 * reading zeros there afterwards (as allocators that track zeroed extents do). Under
 * `attune run` with a budget a quarter of its footprint, most of the advised range is in
 * a far tier when the advice comes: it must read as zero all the same. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 0) : 128, n = mib << 20, words = n / 8;
    uint64_t *a = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) { perror("mmap"); return 2; }
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9E3779B97F4A7C15ull | 1;
    if (madvise(a, n / 2, MADV_DONTNEED) != 0) { perror("madvise"); return 3; }
    size_t nonzero = 0, changed = 0;
    for (size_t i = 0; i < words / 2; i++) nonzero += a[i] != 0;
    for (size_t i = words / 2; i < words; i++) changed += a[i] != (i * 0x9E3779B97F4A7C15ull | 1);
    if (nonzero || changed) {
        printf("madvise_zero: FAIL %zu words not zero after MADV_DONTNEED, %zu others changed\n", nonzero, changed);
        return 1;
    }
    printf("madvise_zero: OK %zu MiB\n", mib);
    munmap(a, n);
    return 0;
}
