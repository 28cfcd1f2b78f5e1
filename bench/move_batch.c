/* What one UFFDIO_MOVE costs per page while another thread of the process runs (so every
 * TLB flush is an IPI): 64 pages moved as one contiguous run, the same 64 pages moved one
 * call each, and 32 pages spread over a 64-page span (every other source page a hole,
 * UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES, one call). It decides how far eviction can batch its
 * flushes (docs/benchmarks-history.md, "Why eviction stays one move per run").
 * Build: gcc -O2 bench/move_batch.c -o move_batch -lpthread */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/types.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#ifndef UFFD_FEATURE_MOVE /* Linux 6.8 UAPI, for older headers */
#define UFFD_FEATURE_MOVE (1 << 16)
struct uffdio_move { __u64 dst, src, len, mode; __s64 move; };
#define UFFDIO_MOVE_MODE_DONTWAKE ((__u64)1 << 0)
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES ((__u64)1 << 1)
#define UFFDIO_MOVE _IOWR(UFFDIO, 0x05, struct uffdio_move)
#endif
enum { PS = 4096, N = 64, ROUNDS = 600 };
static atomic_int stop;
static volatile char *probe;
static int uffd;
static char buf[PS];
static void *spin(void *a) { (void)a; unsigned long x = 0; while (!stop) x += probe[0]; return (void *)x; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int place(char *at) {
    struct uffdio_copy c = {.dst = (unsigned long)at, .src = (unsigned long)buf, .len = PS, .mode = UFFDIO_COPY_MODE_DONTWAKE};
    return ioctl(uffd, UFFDIO_COPY, &c);
}
static int move(char *dst, char *src, size_t len, int holes) {
    struct uffdio_move m = {.dst = (unsigned long)dst, .src = (unsigned long)src, .len = len,
                            .mode = UFFDIO_MOVE_MODE_DONTWAKE | (holes ? UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES : 0)};
    return ioctl(uffd, UFFDIO_MOVE, &m);
}
int main(void) {
    uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_MOVE};
    if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) { perror("userfaultfd with UFFD_FEATURE_MOVE"); return 1; }
    char *a = mmap(NULL, 2 * N * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), *b = a + N * PS;
    struct uffdio_register reg = {.range = {(unsigned long)a, 2 * N * PS}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (a == MAP_FAILED || ioctl(uffd, UFFDIO_REGISTER, &reg)) { perror("register"); return 1; }
    memset(buf, 7, sizeof buf);
    char *p = mmap(NULL, PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p[0] = 1; probe = p;
    pthread_t t; pthread_create(&t, 0, spin, 0);
    double secs[3] = {0}; long pages[3] = {0};
    for (int r = 0; r < ROUNDS; r++) {
        int k = r % 3, step = k == 2 ? 2 : 1;
        for (int i = 0; i < N; i += step)
            if (place(a + i * PS)) { perror("UFFDIO_COPY"); return 1; }
        double s = now();
        int rc = 0;
        if (k == 1) for (int i = 0; i < N && !rc; i++) rc = move(b + i * PS, a + i * PS, PS, 0);
        else rc = move(b, a, N * PS, k == 2);
        secs[k] += now() - s; pages[k] += N / step;
        if (rc) { perror("UFFDIO_MOVE"); return 1; }
        madvise(a, 2 * N * PS, MADV_DONTNEED);
    }
    stop = 1; pthread_join(t, 0);
    printf("UFFDIO_MOVE per page: contiguous 64-page run %.2f us, one page a call %.2f us, "
           "every other page a hole %.2f us\n",
           secs[0] / pages[0] * 1e6, secs[1] / pages[1] * 1e6, secs[2] / pages[2] * 1e6);
    return 0;
}
