/* Threads that end every way glibc has, under the interposer's pthread_create (which
 * under `attune profile` runs each start routine behind the runtime's hooks:
 * crates/attune-sys/src/threads.rs):
 *   thread_cancel N
 * N rounds of four threads: one returns, one calls pthread_exit, one is cancelled while
 * it sleeps (deferred cancellation: glibc unwinds through every frame above its start
 * routine, the wrapper's included, and runs its cleanup handler), one is detached and
 * posts a semaphore. The main thread checks every return value and cleanup, and prints
 * "thread_cancel: OK" when all are right. */
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile uint64_t cleaned;
static sem_t done;

static void *returns(void *p) { return (void *)((uintptr_t)p * 3); }

static void *exits(void *p) {
    pthread_exit((void *)((uintptr_t)p * 5));
    return NULL;
}

static void cleanup(void *p) { __atomic_add_fetch(&cleaned, (uintptr_t)p, __ATOMIC_SEQ_CST); }

static void *cancelled(void *p) {
    pthread_cleanup_push(cleanup, p);
    for (;;) sleep(1);
    pthread_cleanup_pop(0);
    return NULL;
}

static void *detached(void *p) {
    (void)p;
    sem_post(&done);
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 50;
    uint64_t want_clean = 0;
    /* Something for the runtime to manage first, so it (and under `attune profile` the
     * sampler that follows threads) runs before the threads start. */
    size_t len = 64 << 20;
    uint64_t *big = malloc(len), sum = 0;
    for (size_t k = 0; k < len / 8; k++) big[k] = k;
    sem_init(&done, 0, 0);
    for (uintptr_t i = 1; i <= (uintptr_t)n; i++) {
        pthread_t a, b, c, d;
        pthread_attr_t at;
        void *ra, *rb, *rc;
        if (pthread_create(&a, NULL, returns, (void *)i) || pthread_create(&b, NULL, exits, (void *)i) ||
            pthread_create(&c, NULL, cancelled, (void *)i)) {
            printf("thread_cancel: cannot start a thread\n");
            return 1;
        }
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&d, &at, detached, NULL)) return 1;
        pthread_attr_destroy(&at);
        usleep(1000);
        pthread_cancel(c);
        pthread_join(a, &ra);
        pthread_join(b, &rb);
        pthread_join(c, &rc);
        sem_wait(&done);
        want_clean += i;
        if ((uintptr_t)ra != i * 3 || (uintptr_t)rb != i * 5 || rc != PTHREAD_CANCELED) {
            printf("thread_cancel: WRONG round %lu: %p %p %p\n", (unsigned long)i, ra, rb, rc);
            return 1;
        }
    }
    if (cleaned != want_clean) {
        printf("thread_cancel: WRONG cleanups %llu != %llu\n", (unsigned long long)cleaned,
               (unsigned long long)want_clean);
        return 1;
    }
    for (size_t k = 0; k < len / 8; k++) sum += big[k];
    free(big);
    if (sum != (len / 8) * (len / 8 - 1) / 2) return 1;
    printf("thread_cancel: OK %d rounds\n", n);
    return 0;
}
