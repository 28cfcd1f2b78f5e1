/* Coroutines on stacks the program allocates (ucontext: makecontext/swapcontext), as
 * tasking runtimes (Argobots, Qthreads) and coroutine libraries run user-level threads.
 * argv[1] coroutines (default 64), each on a malloc'd stack of argv[2] KiB (default 1024),
 * argv[3] rounds (default 4): in each round every coroutine recurses through most of its
 * stack writing a pattern in each frame, yields to main at the bottom, and checks every
 * frame on the way back. Under `attune run` the stacks are managed memory; with more
 * stack than the budget, a suspended coroutine's pages go to a far tier. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define FRAME 4096
static ucontext_t main_ctx, *ctx;
static int ncoro, rounds, depth;
static long bad;

static void deep(int id, int n, int round) {
    volatile unsigned char pad[FRAME - 128];
    unsigned char v = (unsigned char)(id * 31 + n * 7 + round);
    memset((void *)pad, v, sizeof pad);
    if (n > 0) {
        deep(id, n - 1, round);
    } else {
        swapcontext(&ctx[id], &main_ctx); /* suspended at the bottom of its stack */
    }
    for (size_t i = 0; i < sizeof pad; i += 256)
        if (pad[i] != v) bad++;
}

static void body(int id) {
    for (int r = 0; r < rounds; r++) {
        deep(id, depth, r);
        swapcontext(&ctx[id], &main_ctx);
    }
}

int main(int argc, char **argv) {
    ncoro = argc > 1 ? atoi(argv[1]) : 64;
    size_t kib = argc > 2 ? strtoul(argv[2], 0, 10) : 1024;
    rounds = argc > 3 ? atoi(argv[3]) : 4;
    depth = (int)(kib * 1024 * 3 / 4 / FRAME);
    ctx = calloc(ncoro, sizeof *ctx);
    if (!ctx) return 2;
    for (int i = 0; i < ncoro; i++) {
        getcontext(&ctx[i]);
        ctx[i].uc_stack.ss_size = kib * 1024;
        ctx[i].uc_stack.ss_sp = malloc(kib * 1024);
        ctx[i].uc_link = &main_ctx;
        if (!ctx[i].uc_stack.ss_sp) return 2;
        makecontext(&ctx[i], (void (*)(void))body, 1, i);
    }
    /* Each round: every coroutine down to its bottom, then every one back up. */
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < ncoro; i++) swapcontext(&main_ctx, &ctx[i]);
        for (int i = 0; i < ncoro; i++) swapcontext(&main_ctx, &ctx[i]);
    }
    for (int i = 0; i < ncoro; i++) free(ctx[i].uc_stack.ss_sp);
    if (bad) {
        printf("coro_stacks: %ld frame words WRONG\n", bad);
        return 1;
    }
    printf("coro_stacks: OK %d coroutines x %zu KiB, %d rounds\n", ncoro, kib, rounds);
    return 0;
}
