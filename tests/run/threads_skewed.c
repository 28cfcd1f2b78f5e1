/* skewed.c's two phases (uniform, then HOT 10% of pages taking 90% of the accesses),
 * run where `attune profile`'s clock must follow threads it has not seen before:
 *   threads_skewed churn MIB SECONDS SLICE_MS [BEFORE]
 *       each phase runs in successive threads of SLICE_MS each, one at a time (a program
 *       that starts a thread per task: hundreds over the run; every second one ends by
 *       pthread_exit); BEFORE threads (default 0)
 *       run first, 64 at a time, each for 3 ms: a program that has started thousands of
 *       threads when its phases begin;
 *   threads_skewed fork MIB SECONDS IDLE
 *       the parent starts IDLE threads that wait, then forks; the child runs both phases
 *       on the memory it inherited and the parent waits for it.
 * Every access adds 1 to a word; the sum must equal the number of accesses. Phase marks
 * are weak symbols (present under `attune profile`).                                   */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int attune_phase_begin(const char *name) __attribute__((weak));
int attune_phase_end(void) __attribute__((weak));

static uint64_t *a;
static size_t pages, hot_pages;
static uint64_t x = 88172645463325252ull, accesses;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Random accesses until `end`: uniform, or 90% of them on the first `hot_pages`. */
static void run(double end, int skewed) {
    uint32_t cut = (uint32_t)(0.9 * 4294967295.0);
    while (now() < end) {
        for (int k = 0; k < 4096; k++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            size_t page = !skewed ? (x >> 32) % pages
                          : ((uint32_t)x < cut) ? (x >> 32) % hot_pages
                                                : hot_pages + (x >> 32) % (pages - hot_pages);
            a[page * 512 + ((x >> 20) & 511)] += 1;
            accesses++;
        }
    }
}

struct slice { double end; int skewed, exits; };

/* A task; every second one ends by pthread_exit rather than a return (both are a thread's
 * end the profile's clock must see). */
static void *slice_main(void *p) {
    struct slice *s = p;
    run(s->end, s->skewed);
    if (s->exits) pthread_exit(NULL);
    return NULL;
}

/* One phase in successive threads of `slice_ms` each. */
static int churn(double secs, int skewed, double slice_ms) {
    double end = now() + secs;
    int n = 0;
    while (now() < end) {
        struct slice s = {now() + slice_ms / 1000, skewed, n & 1};
        if (s.end > end) s.end = end;
        pthread_t t;
        if (pthread_create(&t, NULL, slice_main, &s) != 0 || pthread_join(t, NULL) != 0) {
            fprintf(stderr, "threads_skewed: cannot start a thread\n");
            return -1;
        }
        n++;
    }
    return n;
}

static void *brief_main(void *p) {
    (void)p;
    double end = now() + 0.003;
    while (now() < end) {
    }
    return NULL;
}

/* `n` threads of 3 ms, 64 at a time. */
static int before(int n) {
    pthread_t t[64];
    for (int done = 0; done < n; done += 64) {
        int k = n - done < 64 ? n - done : 64;
        for (int i = 0; i < k; i++)
            if (pthread_create(&t[i], NULL, brief_main, NULL) != 0) return -1;
        for (int i = 0; i < k; i++) pthread_join(t[i], NULL);
    }
    return 0;
}

static int phases(const char *mode, double secs, double slice_ms) {
    int threads = 0;
    for (int skewed = 0; skewed < 2; skewed++) {
        if (attune_phase_begin) attune_phase_begin(skewed ? "skewed" : "uniform");
        if (!strcmp(mode, "churn")) {
            int n = churn(secs, skewed, slice_ms);
            if (n < 0) return 1;
            threads += n;
        } else {
            run(now() + secs, skewed);
        }
        if (attune_phase_end) attune_phase_end();
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < pages * 512; i++) sum += a[i];
    if (sum != accesses) {
        printf("threads_skewed: CORRUPT sum %llu != accesses %llu\n", (unsigned long long)sum,
               (unsigned long long)accesses);
        fflush(stdout);
        return 1;
    }
    printf("threads_skewed: OK %s accesses=%llu threads=%d\n", mode, (unsigned long long)accesses,
           threads);
    fflush(stdout); /* the fork child leaves by _exit */
    return 0;
}

static int gate[2];

static void *idle_main(void *p) {
    char c;
    (void)p;
    while (read(gate[0], &c, 1) > 0) {
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5 || (strcmp(argv[1], "churn") && strcmp(argv[1], "fork"))) {
        fprintf(stderr, "usage: threads_skewed churn|fork MIB SECONDS SLICE_MS|IDLE [BEFORE]\n");
        return 2;
    }
    size_t mib = strtoul(argv[2], 0, 10);
    double secs = atof(argv[3]), arg = atof(argv[4]);
    pages = mib * 256;
    hot_pages = pages / 10;
    a = malloc(pages * 4096);
    if (!a || hot_pages == 0) {
        fprintf(stderr, "threads_skewed: bad sizes\n");
        return 2;
    }
    memset(a, 0, pages * 4096);
    if (!strcmp(argv[1], "churn")) {
        if (argc > 5 && before(atoi(argv[5])) != 0) {
            fprintf(stderr, "threads_skewed: cannot start a thread\n");
            return 2;
        }
        return phases("churn", secs, arg);
    }
    int idle = (int)arg;
    pthread_t *t = calloc(idle, sizeof *t);
    if (!t || pipe(gate) != 0) return 2;
    for (int i = 0; i < idle; i++)
        if (pthread_create(&t[i], NULL, idle_main, NULL) != 0) {
            fprintf(stderr, "threads_skewed: cannot start thread %d\n", i);
            return 2;
        }
    /* Let the runtime's sampler find them first. */
    usleep(100000);
    pid_t pid = fork();
    if (pid < 0) return 2;
    if (pid == 0) _exit(phases("fork", secs, 0));
    int st = 0;
    waitpid(pid, &st, 0);
    close(gate[1]);
    for (int i = 0; i < idle; i++) pthread_join(t[i], NULL);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
