/* The cost of dropping scattered pages while another thread of the process runs: one
 * madvise(MADV_DONTNEED) per page (a TLB-shootdown IPI each) against one process_madvise
 * over all of them (the kernel flushes once for the batch). It decides how the memory tier
 * should release arena slots after a fetch (docs/benchmarks-history.md, "What the fault-path
 * fixes ... cost"). Build: gcc -O2 bench/tlb_batch.c -o tlb_batch -lpthread */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
static atomic_int stop;
static volatile char *arena;
static void *spin(void *a) { (void)a; unsigned long x = 0; while (!stop) { x += arena[0]; } return (void*)x; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
    size_t ps = 4096, n = 64, stride = 7, rounds = 2000;
    char *a = mmap(NULL, n * stride * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    arena = a;
    pthread_t t; pthread_create(&t, 0, spin, 0);
    int pidfd = syscall(SYS_pidfd_open, getpid(), 0);
    struct iovec iov[64];
    for (size_t i = 0; i < n; i++) { iov[i].iov_base = a + i * stride * ps; iov[i].iov_len = ps; }
    double t_single = 0, t_batch = 0;
    for (size_t r = 0; r < rounds; r++) {
        for (size_t i = 0; i < n; i++) a[i * stride * ps] = 1;
        double t0 = now();
        for (size_t i = 0; i < n; i++) madvise(a + i * stride * ps, ps, MADV_DONTNEED);
        t_single += now() - t0;
        for (size_t i = 0; i < n; i++) a[i * stride * ps] = 1;
        t0 = now();
        long rc = syscall(SYS_process_madvise, pidfd, iov, n, MADV_DONTNEED, 0);
        if (rc < 0) { perror("process_madvise"); return 1; }
        t_batch += now() - t0;
    }
    stop = 1; pthread_join(t, 0);
    printf("64 scattered pages, another thread running: madvise each %.2f us/page, process_madvise batch %.2f us/page\n",
           t_single / rounds / n * 1e6, t_batch / rounds / n * 1e6);
    return 0;
}
