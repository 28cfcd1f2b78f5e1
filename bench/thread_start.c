/* Cost of starting a thread: `thread_start N` allocates 64 MiB (so that under Attune the
 * runtime, and under `attune profile` its sampler, run first), then starts and joins N
 * threads one at a time whose body does nothing, and prints "thread_start: NS ns a
 * thread" (wall time over N). bench/thread_start.sh runs it bare, under `attune run` and
 * under `attune profile`, where the interposer's pthread_create runs each thread behind
 * the program clock's hooks. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void *nothing(void *p) { return p; }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    if (n <= 0) {
        fprintf(stderr, "usage: thread_start [N>0]\n");
        return 2;
    }
    char *big = malloc(64 << 20);
    if (!big) return 1;
    memset(big, 1, 64 << 20);
    double t0 = now();
    for (intptr_t i = 0; i < n; i++) {
        pthread_t t;
        void *r;
        if (pthread_create(&t, NULL, nothing, (void *)i) || pthread_join(t, &r) || r != (void *)i) {
            printf("thread_start: FAILED at %ld\n", (long)i);
            return 1;
        }
    }
    double t1 = now();
    printf("thread_start: %.0f ns a thread\n", (t1 - t0) / n * 1e9);
    free(big);
    return 0;
}
