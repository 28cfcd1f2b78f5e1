/* attune run test: fork and exec under the interposer. The parent keeps a managed
 * buffer; a forked child reads it (inherited), allocates and verifies its own, frees the
 * inherited pointer (its copy only), then execs a second program that is managed too.
 * The parent's data must be intact afterwards. Usage: fork_exec MiB PROG
 * FORK_TOUCH=1: the child checks the whole inherited buffer, rewrites it and checks it
 * again while the parent rewrites its own; prints "fork_touch: OK". */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t mix(uint64_t x) { x ^= x >> 31; x *= 0x9E3779B97F4A7C15ull; return x ^ (x >> 29); }

static int fill_check(size_t n, uint64_t salt) {
  uint64_t *p = malloc(n * 8);
  if (!p) return 1;
  for (size_t i = 0; i < n; i++) p[i] = mix(i ^ salt);
  for (size_t i = 0; i < n; i++) if (p[i] != mix(i ^ salt)) return 1;
  free(p);
  return 0;
}

int main(int argc, char **argv) {
  size_t n = (strtoul(argc > 1 ? argv[1] : "64", 0, 10) << 20) / 8;
  uint64_t *keep = malloc(n * 8);
  for (size_t i = 0; i < n; i++) keep[i] = mix(i);
  if (getenv("FORK_TOUCH")) { /* the child reads and writes the parent's managed buffer */
    pid_t t = fork();
    if (t == 0) {
      for (size_t i = 0; i < n; i++) if (keep[i] != mix(i)) _exit(1);
      for (size_t i = 0; i < n; i++) keep[i] = mix(i) ^ 7;
      for (size_t i = 0; i < n; i++) if (keep[i] != (mix(i) ^ 7)) _exit(2);
      _exit(0);
    }
    for (size_t i = 0; i < n; i++) keep[i] = mix(i) ^ 5;
    int st = 0, bad = 0;
    waitpid(t, &st, 0);
    for (size_t i = 0; i < n; i++) if (keep[i] != (mix(i) ^ 5)) { bad = 1; break; }
    printf("fork_touch: %s status=%d\n", WIFEXITED(st) && WEXITSTATUS(st) == 0 && !bad ? "OK" : "BAD", st);
    return 0;
  }
  pid_t c = fork();
  if (c == 0) {
    for (size_t i = 0; i < n; i++) if (keep[i] != mix(i)) _exit(5);
    int bad = fill_check(n, 99);
    free(keep); /* the child's copy only */
    if (bad) _exit(3);
    if (argc > 2) { execv(argv[2], argv + 2); _exit(4); }
    _exit(0);
  }
  int st = 0;
  waitpid(c, &st, 0);
  int bad = !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  for (size_t i = 0; i < n; i++) if (keep[i] != mix(i)) { bad = 1; break; }
  printf("fork_exec: %s child_status=%d\n", bad ? "BAD" : "OK", st);
  free(keep);
  return bad;
}
