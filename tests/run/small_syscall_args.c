// Under `attune run --small` the whole heap is managed: small objects that are the
// arguments of system calls no wrapper covers (path strings, stat buffers) must still
// work after the budget moved them out. Writes N paths into malloc'd strings, fills the
// heap well past the budget, then stats each path into a malloc'd buffer.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 64;
  size_t junk_mib = argc > 2 ? (size_t)atoi(argv[2]) : 96;
  char **paths = malloc((size_t)n * sizeof *paths);
  struct stat **st = malloc((size_t)n * sizeof *st);
  for (int i = 0; i < n; i++) {
    paths[i] = malloc(200);
    snprintf(paths[i], 200, "/tmp/attune-small-args-%d-%d-%0140d", (int)getpid(), i, 0);
    FILE *f = fopen(paths[i], "w");
    if (!f) { perror(paths[i]); return 2; }
    fprintf(f, "%d", i);
    fclose(f);
    st[i] = malloc(sizeof **st);
    memset(st[i], 0, sizeof **st);
  }
  // 4000-byte objects: small requests, spread over pages, pushing the above out.
  size_t count = (junk_mib << 20) / 4000;
  char **junk = malloc(count * sizeof *junk);
  for (size_t i = 0; i < count; i++) { junk[i] = malloc(4000); memset(junk[i], (int)i, 4000); }
  int bad = 0, err = 0;
  for (int i = 0; i < n; i++) {
    if (stat(paths[i], st[i]) != 0 || st[i]->st_size != (i < 10 ? 1 : i < 100 ? 2 : 3)) {
      bad++; err = errno;
    }
  }
  // Removed through a copy on the stack (never managed): a failed run leaves no files.
  for (int i = 0; i < n; i++) {
    char path[200];
    memcpy(path, paths[i], sizeof path);
    unlink(path);
  }
  printf("small_syscall_args: %d of %d stat calls failed (%s)\n", bad, n, bad ? strerror(err) : "none");
  if (bad) return 1;
  puts("small_syscall_args: OK");
  return 0;
}
