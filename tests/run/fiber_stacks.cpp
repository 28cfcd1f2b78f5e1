// Fibers of Boost.Context on stacks it allocates with malloc (fixedsize_stack), switched
// by its own assembly: nothing the program imports from libc says so, only the library it
// links (docs/design/run.md, "Programs whose stacks are in their heap"). argv[1] fibers
// (default 64) of argv[2] KiB (default 1024), argv[3] rounds (default 4): in each round
// every fiber recurses through most of its stack writing a pattern in each frame, yields
// at the bottom, and checks every frame on the way back.
#include <boost/context/fiber.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace ctx = boost::context;

static long bad;
static const int FRAME = 4096;

static ctx::fiber deep(ctx::fiber &&main, int id, int n, int round) {
    volatile unsigned char pad[FRAME - 128];
    unsigned char v = (unsigned char)(id * 31 + n * 7 + round);
    memset((void *)pad, v, sizeof pad);
    if (n > 0)
        main = deep(std::move(main), id, n - 1, round);
    else
        main = std::move(main).resume(); // suspended at the bottom of its stack
    for (size_t i = 0; i < sizeof pad; i += 256)
        if (pad[i] != v) bad++;
    return std::move(main);
}

int main(int argc, char **argv) {
    int nfib = argc > 1 ? atoi(argv[1]) : 64;
    size_t kib = argc > 2 ? strtoul(argv[2], 0, 10) : 1024;
    int rounds = argc > 3 ? atoi(argv[3]) : 4;
    int depth = (int)(kib * 1024 * 3 / 4 / FRAME);
    std::vector<ctx::fiber> fibers;
    for (int i = 0; i < nfib; i++)
        fibers.emplace_back(std::allocator_arg, ctx::fixedsize_stack(kib * 1024),
                            [i, rounds, depth](ctx::fiber &&main) {
                                for (int r = 0; r < rounds; r++) {
                                    main = deep(std::move(main), i, depth, r);
                                    main = std::move(main).resume();
                                }
                                return std::move(main);
                            });
    // Each round: every fiber down to its bottom, then every one back up.
    for (int r = 0; r < rounds; r++) {
        for (auto &f : fibers) f = std::move(f).resume();
        for (auto &f : fibers) f = std::move(f).resume();
    }
    for (auto &f : fibers) f = std::move(f).resume(); // the last returns
    if (bad) {
        printf("fiber_stacks: %ld frame words WRONG\n", bad);
        return 1;
    }
    printf("fiber_stacks: OK %d fibers x %zu KiB, %d rounds\n", nfib, kib, rounds);
    return 0;
}
