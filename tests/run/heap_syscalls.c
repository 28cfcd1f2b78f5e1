/* attune run test: system calls no wrapper covers, on heap memory the budget moved out
 * and on fresh memory. glibc's opendir/readdir fill a malloc'd buffer with its internal
 * getdents64; stat(2) reads a path string and writes a stat buffer. With jemalloc,
 * tcmalloc or mimalloc (linked or preloaded) those small objects live in mappings the
 * allocator made with mmap, which the interposer manages: under signal delivery the
 * kernel's access to a fresh or moved-out page of one failed with EFAULT (os.listdir
 * under jemalloc, "Bad address"). The mapping part does the same on the program's own
 * mmap: getcwd and getdents64 into fresh pages, stat of a path string moved out.
 * Usage: heap_syscalls heap|mapping|all [junk MiB]. Prints "heap_syscalls: OK".
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FILES 64
static int bad;
#define CHECK(c, ...) do { if (!(c)) { bad++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (%s)\n", strerror(errno)); } } while (0)

static char dir[128];

/* Blocks below the interposer's threshold: the program's allocator serves them. */
static void junk(size_t mib, int seed) {
  size_t n = (mib << 20) / 40000;
  for (size_t i = 0; i < n; i++) {
    char *b = malloc(40000);
    if (!b) { perror("malloc"); exit(2); }
    memset(b, (int)(i + seed), 40000);
  }
}

static int count_entries(void) {
  DIR *d = opendir(dir);
  if (!d) return -errno;
  int n = 0;
  errno = 0;
  struct dirent *e;
  while ((e = readdir(d))) n++;
  int err = errno;
  closedir(d);
  return err ? -err : n;
}

static void heap_part(size_t junk_mib) {
  junk(junk_mib / 4, 0); /* the allocator maps more: what follows lands there */
  char **paths = malloc(FILES * sizeof *paths);
  struct stat **st = malloc(FILES * sizeof *st);
  for (int i = 0; i < FILES; i++) {
    paths[i] = malloc(256);
    snprintf(paths[i], 256, "%s/file-%d-%080d", dir, i, 0);
    st[i] = malloc(sizeof **st);
    memset(st[i], 0, sizeof **st);
  }
  junk(junk_mib, 1);
  int failed = 0;
  for (int i = 0; i < FILES; i++)
    if (stat(paths[i], st[i]) != 0 || st[i]->st_size != (i < 10 ? 1 : 2)) failed++;
  CHECK(failed == 0, "heap: %d of %d stat calls failed", failed, FILES);
  /* Directory entries read into blocks of about 32 KiB (the allocator's 40 KiB class,
   * as opendir's buffer): glibc's readdir fills one with its internal getdents64. Odd
   * rounds read into a block on pages nobody has touched (64 unwritten blocks first put
   * it past the runtime's read-ahead of the last writes); even rounds write the block,
   * then junk moves it out, then read into it. readdir itself copes with a failed page
   * after the first (getdents64 returns the entries that fit before it), so the raw
   * call is checked too. */
  int wrong = 0, failed_raw = 0, last = 0;
  for (int r = 0; r < 48; r++) {
    int n = count_entries();
    if (n != FILES + 2) { wrong++; last = n; }
    char *b;
    if (r % 2) {
      for (int k = 0; k < 64; k++) {
        void *volatile keep = malloc(36000);
        (void)keep;
      }
      b = malloc(36000);
    } else {
      b = malloc(36000);
      memset(b, r, 36000);
      junk(junk_mib / 16 + 1, r);
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    long k = syscall(SYS_getdents64, fd, b, 32768);
    if (k <= 0) { failed_raw++; last = -errno; }
    close(fd);
  }
  errno = last < 0 ? -last : 0;
  CHECK(wrong == 0, "heap: %d of 48 directory listings wrong", wrong);
  CHECK(failed_raw == 0, "heap: %d of 48 getdents64 calls into a heap block failed", failed_raw);
}

static void mapping_part(size_t junk_mib) {
  size_t len = 8 << 20;
  char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) { perror("mmap"); exit(2); }
  char here[4096];
  CHECK(getcwd(here, sizeof here) != NULL, "getcwd on the stack");
  char *c = getcwd(p + (3 << 20), 4096);
  CHECK(c && strcmp(c, here) == 0, "mapping: getcwd into a fresh page");
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  long k = syscall(SYS_getdents64, fd, p + (5 << 20), 32768);
  CHECK(k > 0, "mapping: getdents64 into a fresh page returned %ld", k);
  close(fd);
  char *path = p + (6 << 20);
  snprintf(path, 256, "%s/file-%d-%080d", dir, 0, 0);
  struct stat *sb = (struct stat *)(p + (7 << 20));
  memset(sb, 0, sizeof *sb);
  /* Managed large blocks, written: the budget moves the mapping's pages out. */
  size_t big = junk_mib << 20;
  char *b = malloc(big);
  if (!b) { perror("malloc"); exit(2); }
  memset(b, 7, big);
  CHECK(stat(path, sb) == 0 && sb->st_size == 1, "mapping: stat of a moved-out path into a moved-out buffer");
  free(b);
  munmap(p, len);
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "all";
  size_t junk_mib = argc > 2 ? (size_t)atoi(argv[2]) : 64;
  /* A managed request first: the runtime starts, so the allocator's later mappings are
   * the interposer's to judge. */
  void *volatile first = malloc(4 << 20);
  free(first);
  snprintf(dir, sizeof dir, "/tmp/attune-heap-syscalls-%d", (int)getpid());
  if (mkdir(dir, 0700) != 0) { perror(dir); return 2; }
  for (int i = 0; i < FILES; i++) {
    char path[256];
    snprintf(path, sizeof path, "%s/file-%d-%080d", dir, i, 0);
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); return 2; }
    fprintf(f, "%d", i);
    fclose(f);
  }
  if (!strcmp(what, "heap") || !strcmp(what, "all")) heap_part(junk_mib);
  if (!strcmp(what, "mapping") || !strcmp(what, "all")) mapping_part(junk_mib);
  /* Removed through copies on the stack (never managed): a failed run leaves nothing. */
  for (int i = 0; i < FILES; i++) {
    char path[256];
    snprintf(path, sizeof path, "%s/file-%d-%080d", dir, i, 0);
    unlink(path);
  }
  rmdir(dir);
  if (bad) { printf("heap_syscalls: %d check(s) failed\n", bad); return 1; }
  puts("heap_syscalls: OK");
  return 0;
}
