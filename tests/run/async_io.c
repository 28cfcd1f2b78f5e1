/* Asynchronous I/O into memory the program has let go cold, under `attune run`'s default
 * fault delivery (auto): io_uring (liburing), Linux AIO (libaio), POSIX AIO (glibc), and a
 * library loaded with dlopen after a first buffer was made.
 *
 *   async_io DIR MIB
 *
 * Built once per backend, so that each binary shows the loader only its own evidence:
 * -DUSE_URING (-luring), -DUSE_LIBAIO (-laio), -DUSE_POSIX, -DUSE_LATE (links neither).
 *
 * A buffer of MIB MiB (several times the budget) is written all through, so most of it
 * is in a far tier; then a file of a second pattern is read into it by the backend, and
 * every page is checked; then the buffer is given a third pattern and written out by the
 * backend, and the file is read back with plain pread into a small unmanaged buffer.
 * The kernel (or glibc's helper threads) touches the non-resident pages: under signal
 * delivery that fails with EFAULT, so the test passes only if the delivery chosen for the
 * buffer serves kernel accesses (docs/design/run.md, "Fault delivery").
 *
 * `late`: the program links none of them; it makes one buffer, then dlopens libaio, then
 * makes the I/O buffer and reads through libaio's functions found with dlsym. */
#define _GNU_SOURCE
#include <aio.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libaio.h>
#ifdef USE_URING
#include <liburing.h>
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PIECE (1 << 20) /* bytes per request */
#define DEPTH 8         /* requests in flight */

static void die(const char *what, int err) {
  fprintf(stderr, "async_io: %s: %s\n", what, strerror(err));
  exit(1);
}

static uint64_t word(uint64_t i, uint64_t seed) { return i * 0x9E3779B97F4A7C15ull ^ seed; }

static void fill(uint64_t *b, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) b[i] = word(i, seed);
}

/* The first index where b differs from the pattern, or n. */
static size_t check(const uint64_t *b, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++)
    if (b[i] != word(i, seed)) return i;
  return n;
}

typedef int (*rw_fn)(int fd, char *buf, size_t len, int write);

#ifdef USE_URING
/* ---- io_uring ---- */
static int rw_uring(int fd, char *buf, size_t len, int write) {
  struct io_uring ring;
  int r = io_uring_queue_init(DEPTH, &ring, 0);
  if (r < 0) die("io_uring_queue_init", -r);
  size_t next = 0, done = 0;
  unsigned inflight = 0;
  while (done < len) {
    while (inflight < DEPTH && next < len) {
      struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
      size_t n = len - next < PIECE ? len - next : PIECE;
      if (write)
        io_uring_prep_write(sqe, fd, buf + next, n, next);
      else
        io_uring_prep_read(sqe, fd, buf + next, n, next);
      io_uring_sqe_set_data64(sqe, n);
      next += n;
      inflight++;
    }
    io_uring_submit(&ring);
    struct io_uring_cqe *cqe;
    r = io_uring_wait_cqe(&ring, &cqe);
    if (r < 0) die("io_uring_wait_cqe", -r);
    if (cqe->res < 0) die(write ? "io_uring write" : "io_uring read", -cqe->res);
    if ((uint64_t)cqe->res != io_uring_cqe_get_data64(cqe)) {
      fprintf(stderr, "async_io: io_uring: short transfer %d of %llu\n", cqe->res,
              (unsigned long long)io_uring_cqe_get_data64(cqe));
      exit(1);
    }
    done += cqe->res;
    inflight--;
    io_uring_cqe_seen(&ring, cqe);
  }
  io_uring_queue_exit(&ring);
  return 0;
}

#endif

#if defined(USE_LIBAIO) || defined(USE_LATE)
/* ---- Linux AIO, through function pointers so that `late` can find them with dlsym ---- */
static int (*p_io_setup)(int, io_context_t *);
static int (*p_io_submit)(io_context_t, long, struct iocb **);
static int (*p_io_getevents)(io_context_t, long, long, struct io_event *, struct timespec *);
static int (*p_io_destroy)(io_context_t);

static int rw_libaio(int fd, char *buf, size_t len, int write) {
  io_context_t ctx = 0;
  int r = p_io_setup(DEPTH, &ctx);
  if (r < 0) die("io_setup", -r);
  struct iocb cbs[DEPTH], *ptrs[1];
  size_t next = 0, done = 0;
  unsigned inflight = 0;
  int slot = 0;
  while (done < len) {
    while (inflight < DEPTH && next < len) {
      size_t n = len - next < PIECE ? len - next : PIECE;
      struct iocb *cb = &cbs[slot++ % DEPTH];
      if (write)
        io_prep_pwrite(cb, fd, buf + next, n, next);
      else
        io_prep_pread(cb, fd, buf + next, n, next);
      ptrs[0] = cb;
      r = p_io_submit(ctx, 1, ptrs);
      if (r != 1) die("io_submit", r < 0 ? -r : EIO);
      next += n;
      inflight++;
    }
    struct io_event ev;
    r = p_io_getevents(ctx, 1, 1, &ev, NULL);
    if (r != 1) die("io_getevents", r < 0 ? -r : EIO);
    long res = (long)ev.res;
    if (res < 0) die(write ? "AIO write" : "AIO read", (int)-res);
    if ((size_t)res != ev.obj->u.c.nbytes) {
      fprintf(stderr, "async_io: AIO: short transfer %ld of %lu\n", res, ev.obj->u.c.nbytes);
      exit(1);
    }
    done += res;
    inflight--;
  }
  p_io_destroy(ctx);
  return 0;
}

#endif

#ifdef USE_POSIX
/* ---- POSIX AIO (glibc: helper threads) ---- */
static int rw_posix(int fd, char *buf, size_t len, int write) {
  struct aiocb cbs[DEPTH];
  for (size_t base = 0; base < len; base += (size_t)DEPTH * PIECE) {
    int k = 0;
    for (; k < DEPTH && base + (size_t)k * PIECE < len; k++) {
      size_t off = base + (size_t)k * PIECE;
      memset(&cbs[k], 0, sizeof cbs[k]);
      cbs[k].aio_fildes = fd;
      cbs[k].aio_buf = buf + off;
      cbs[k].aio_nbytes = len - off < PIECE ? len - off : PIECE;
      cbs[k].aio_offset = off;
      if ((write ? aio_write : aio_read)(&cbs[k]) != 0) die("aio_read/aio_write", errno);
    }
    for (int i = 0; i < k; i++) {
      const struct aiocb *one[1] = {&cbs[i]};
      while (aio_error(&cbs[i]) == EINPROGRESS) aio_suspend(one, 1, NULL);
      int e = aio_error(&cbs[i]);
      ssize_t got = aio_return(&cbs[i]);
      if (e != 0) die(write ? "POSIX AIO write" : "POSIX AIO read", e);
      if ((size_t)got != cbs[i].aio_nbytes) {
        fprintf(stderr, "async_io: POSIX AIO: short transfer %zd\n", got);
        exit(1);
      }
    }
  }
  return 0;
}

#endif

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: async_io DIR MIB\n");
    return 2;
  }
  size_t len = (size_t)atol(argv[2]) << 20, n = len / 8;
  char *first = NULL;
#if defined(USE_URING)
  const char *mode = "uring";
  rw_fn rw = rw_uring;
#elif defined(USE_LIBAIO)
  const char *mode = "libaio";
  rw_fn rw = rw_libaio;
  p_io_setup = io_setup;
  p_io_submit = io_submit;
  p_io_getevents = io_getevents;
  p_io_destroy = io_destroy;
#elif defined(USE_POSIX)
  const char *mode = "posix";
  rw_fn rw = rw_posix;
#elif defined(USE_LATE)
  const char *mode = "late";
  rw_fn rw = rw_libaio;
  /* A region made before the library arrives keeps signal delivery. */
  first = malloc(4 << 20);
  if (!first) die("malloc", ENOMEM);
  memset(first, 1, 4 << 20);
  if (!dlopen("libaio.so.1", RTLD_NOW | RTLD_GLOBAL)) {
    fprintf(stderr, "async_io: dlopen libaio.so.1: %s\n", dlerror());
    return 1;
  }
  p_io_setup = (int (*)(int, io_context_t *))dlsym(RTLD_DEFAULT, "io_setup");
  p_io_submit = (int (*)(io_context_t, long, struct iocb **))dlsym(RTLD_DEFAULT, "io_submit");
  p_io_getevents = (int (*)(io_context_t, long, long, struct io_event *, struct timespec *))dlsym(
      RTLD_DEFAULT, "io_getevents");
  p_io_destroy = (int (*)(io_context_t))dlsym(RTLD_DEFAULT, "io_destroy");
  if (!p_io_setup || !p_io_submit || !p_io_getevents || !p_io_destroy) {
    fprintf(stderr, "async_io: libaio's functions not found\n");
    return 1;
  }
#else
#error "build with one of -DUSE_URING, -DUSE_LIBAIO, -DUSE_POSIX, -DUSE_LATE"
#endif
  char in[4096], out[4096];
  snprintf(in, sizeof in, "%s/async_in.%d", argv[1], getpid());
  snprintf(out, sizeof out, "%s/async_out.%d", argv[1], getpid());

  /* The input file, written from a small unmanaged buffer. */
  int fi = open(in, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fi < 0) die("open input", errno);
  static uint64_t small[8192];
  for (size_t i = 0; i < n; i += 8192) {
    size_t k = n - i < 8192 ? n - i : 8192;
    for (size_t j = 0; j < k; j++) small[j] = word(i + j, 2);
    if (pwrite(fi, small, k * 8, i * 8) != (ssize_t)(k * 8)) die("pwrite input", errno);
  }

  uint64_t *buf = malloc(len);
  if (!buf) die("malloc", ENOMEM);
  fill(buf, n, 1); /* all through: the early pages go to a far tier */
  rw(fi, (char *)buf, len, 0);
  size_t bad = check(buf, n, 2);
  if (bad != n) {
    fprintf(stderr, "async_io: %s read: wrong word at byte %zu\n", mode, bad * 8);
    return 1;
  }

  fill(buf, n, 3);
  int fo = open(out, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fo < 0) die("open output", errno);
  rw(fo, (char *)buf, len, 1);
  for (size_t i = 0; i < n; i += 8192) {
    size_t k = n - i < 8192 ? n - i : 8192;
    if (pread(fo, small, k * 8, i * 8) != (ssize_t)(k * 8)) die("pread output", errno);
    for (size_t j = 0; j < k; j++)
      if (small[j] != word(i + j, 3)) {
        fprintf(stderr, "async_io: %s write: wrong word at byte %zu\n", mode, (i + j) * 8);
        return 1;
      }
  }
  close(fi);
  close(fo);
  unlink(in);
  unlink(out);
  free(buf);
  free(first);
  /* The peak RSS tells a tiered buffer (about the budget) from an untiered one. */
  long hwm = -1;
  FILE *st = fopen("/proc/self/status", "r");
  char line[256];
  while (st && fgets(line, sizeof line, st))
    if (sscanf(line, "VmHWM: %ld", &hwm) == 1) break;
  if (st) fclose(st);
  printf("async_io: OK %s %zu MiB VmHWM_MiB=%ld\n", mode, len >> 20, hwm / 1024);
  return 0;
}
