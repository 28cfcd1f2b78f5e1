/* A program (or a library in it: a checkpointer, a garbage collector, a UCX registration
 * cache) with a userfaultfd of its own, under `attune run`.
 *
 *   own_uffd MIB
 *
 * Registering memory the runtime manages fails with EBUSY (a range belongs to one
 * userfaultfd at a time): the program learns it at once, and the managed data is intact.
 * Its own memory (a mapping below the run threshold's reach: mmap with MAP_NORESERVE of
 * less than the threshold, or any memory outside Attune) registers and is served by the
 * program's own handler as without Attune. Prints "own_uffd: OK". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGE 4096

static int open_uffd(void) {
  /* As an unprivileged program would: user-mode faults are all it needs here. */
  int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
  if (fd < 0) fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
  if (fd < 0) {
    perror("own_uffd: userfaultfd");
    exit(1);
  }
  struct uffdio_api api = {.api = UFFD_API};
  if (ioctl(fd, UFFDIO_API, &api)) {
    perror("own_uffd: UFFDIO_API");
    exit(1);
  }
  return fd;
}

static int uffd;
static char fill_page[PAGE];

/* The program's own handler: fills each missing page with 0x5a. */
static void *serve(void *arg) {
  (void)arg;
  for (;;) {
    struct pollfd p = {.fd = uffd, .events = POLLIN};
    if (poll(&p, 1, -1) < 0) continue;
    struct uffd_msg m;
    if (read(uffd, &m, sizeof m) != sizeof m) continue;
    if (m.event != UFFD_EVENT_PAGEFAULT) continue;
    struct uffdio_copy c = {.dst = m.arg.pagefault.address & ~(uint64_t)(PAGE - 1),
                            .src = (uintptr_t)fill_page, .len = PAGE};
    ioctl(uffd, UFFDIO_COPY, &c);
  }
  return NULL;
}

int main(int argc, char **argv) {
  size_t len = (size_t)(argc > 1 ? atol(argv[1]) : 64) << 20, n = len / 8;
  uint64_t *managed = malloc(len); /* above the threshold: Attune's */
  if (!managed) return 1;
  for (size_t i = 0; i < n; i++) managed[i] = i * 2654435761u;
  uffd = open_uffd();

  struct uffdio_register reg = {.range = {.start = (uintptr_t)managed & ~(uintptr_t)(PAGE - 1),
                                          .len = 16 * PAGE},
                                .mode = UFFDIO_REGISTER_MODE_MISSING};
  reg.range.start += PAGE; /* inside the allocation, page-aligned */
  int r = ioctl(uffd, UFFDIO_REGISTER, &reg);
  if (r == 0) {
    fprintf(stderr, "own_uffd: registering managed memory succeeded; expected EBUSY\n");
    return 1;
  }
  if (errno != EBUSY) {
    fprintf(stderr, "own_uffd: registering managed memory: %s; expected EBUSY\n", strerror(errno));
    return 1;
  }
  for (size_t i = 0; i < n; i++)
    if (managed[i] != i * 2654435761u) {
      fprintf(stderr, "own_uffd: managed word %zu changed\n", i);
      return 1;
    }

  /* The program's own memory: a small mapping Attune does not take (below the
   * threshold), served by its own handler. */
  memset(fill_page, 0x5a, sizeof fill_page);
  size_t own_len = 16 * PAGE;
  unsigned char *own = mmap(NULL, own_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (own == MAP_FAILED) return 1;
  struct uffdio_register mine = {.range = {.start = (uintptr_t)own, .len = own_len},
                                 .mode = UFFDIO_REGISTER_MODE_MISSING};
  if (ioctl(uffd, UFFDIO_REGISTER, &mine)) {
    fprintf(stderr, "own_uffd: registering its own memory: %s\n", strerror(errno));
    return 1;
  }
  pthread_t t;
  pthread_create(&t, NULL, serve, NULL);
  for (size_t i = 0; i < own_len; i += 1000)
    if (own[i] != 0x5a) {
      fprintf(stderr, "own_uffd: its own handler's byte not seen at %zu\n", i);
      return 1;
    }
  free(managed);
  printf("own_uffd: OK\n");
  return 0;
}
