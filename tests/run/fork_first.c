/* A program whose first act is fork, before it allocates anything: under `attune run
 * --small` the child's first small allocation once waited forever on the small
 * allocator's fork gate (the gate's reset registered a thread-local destructor, which
 * allocates, before it opened the gate; GNU time hung so). Parent and child then
 * allocate, fill and check small blocks; exit 0 when both saw their own data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int work(unsigned seed) {
    enum { N = 20000 };
    static char *p[N];
    for (int i = 0; i < N; i++) {
        size_t n = 16 + (i * 37) % 2000;
        p[i] = malloc(n);
        if (!p[i]) return 1;
        memset(p[i], (int)((i + seed) & 0xff), n);
    }
    for (int i = 0; i < N; i++) {
        size_t n = 16 + (i * 37) % 2000;
        for (size_t k = 0; k < n; k += 97)
            if ((unsigned char)p[i][k] != ((i + seed) & 0xff)) return 2;
        free(p[i]);
    }
    return 0;
}

int main(void) {
    pid_t pid = fork();
    if (pid < 0) return 3;
    if (pid == 0) _exit(work(7));
    int bad = work(11), st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "fork_first: child failed (status %#x)\n", st);
        return 4;
    }
    if (bad) {
        fprintf(stderr, "fork_first: parent's blocks wrong (%d)\n", bad);
        return 5;
    }
    printf("fork_first: parent and child OK\n");
    return 0;
}
