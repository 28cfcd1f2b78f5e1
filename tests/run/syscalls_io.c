/* attune run test: system calls into and out of large malloc'd buffers whose pages are
 * mostly in a far tier (the footprint is several times the budget). Where the kernel
 * cannot fault managed pages in (an unprivileged user's user-mode-only userfaultfd, or
 * SIGBUS delivery) each of these failed with EFAULT before the interposer retried them.
 * Every transfer is checked byte for byte; a genuine bad pointer still gets EFAULT.
 * Usage: syscalls_io DIR MiB. Prints "syscalls_io: OK".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

static int bad;
#define CHECK(c, ...) do { if (!(c)) { bad++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno %s)\n", strerror(errno)); } } while (0)

static size_t N;
static unsigned char *src, *dst, *pressure;

static void fill(unsigned char *p, size_t n, unsigned seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i += 8) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; memcpy(p + i, &x, n - i < 8 ? n - i : 8); }
}
/* Touch the other buffer so that most of src and dst go to the far tier. */
static void push_out(void) { for (size_t i = 0; i < N; i += 4096) pressure[i]++; }
static void reset_dst(void) { memset(dst, 0, N); push_out(); }
static int same(size_t n) { return memcmp(src, dst, n) == 0; }

/* Loops of a plain read/write, as programs write them. */
static size_t write_all(int fd, const unsigned char *p, size_t n) {
  size_t d = 0; while (d < n) { ssize_t r = write(fd, p + d, n - d); if (r <= 0) break; d += r; } return d;
}
static size_t read_all(int fd, unsigned char *p, size_t n) {
  size_t d = 0; while (d < n) { ssize_t r = read(fd, p + d, n - d); if (r <= 0) break; d += r; } return d;
}

struct pipe_job { int fd; size_t n; };
static void *pipe_writer(void *a) { struct pipe_job *j = a; write_all(j->fd, src, j->n); close(j->fd); return NULL; }
static void *sock_sender(void *a) {
  struct pipe_job *j = a; size_t d = 0;
  while (d < j->n) { ssize_t r = send(j->fd, src + d, j->n - d, 0); if (r <= 0) break; d += r; }
  shutdown(j->fd, SHUT_WR); return NULL;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "/tmp";
  N = (argc > 2 ? strtoul(argv[2], 0, 10) : 64) << 20;
  src = malloc(N); dst = malloc(N); pressure = malloc(N);
  if (!src || !dst || !pressure) { puts("alloc failed"); return 2; }
  fill(src, N, 1); memset(pressure, 0, N);
  char path[4096]; snprintf(path, sizeof path, "%s/syscalls_io.%d", dir, getpid());

  /* write(2) and read(2) of a regular file, whole buffers. */
  push_out();
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0, "open %s", path);
  ssize_t w = write(fd, src, N);
  CHECK(w == (ssize_t)N, "write returned %zd", w);
  reset_dst();
  ssize_t r = pread(fd, dst, N, 0);
  CHECK(r == (ssize_t)N && same(N), "pread returned %zd", r);
  reset_dst(); lseek(fd, 0, SEEK_SET);
  CHECK(read_all(fd, dst, N) == N && same(N), "read");
  /* pwrite at an offset, vectored I/O across two buffers. */
  push_out();
  CHECK(pwrite(fd, src, N / 2, N) == (ssize_t)(N / 2), "pwrite");
  reset_dst();
  struct iovec iov[2] = {{dst, N / 2}, {dst + N / 2, N / 2}};
  r = preadv(fd, iov, 2, 0);
  CHECK(r == (ssize_t)N && same(N), "preadv returned %zd", r);
  reset_dst(); lseek(fd, N, SEEK_SET);
  r = readv(fd, iov, 1);
  CHECK(r == (ssize_t)(N / 2) && same(N / 2), "readv returned %zd", r);
  push_out(); lseek(fd, 0, SEEK_SET);
  struct iovec wv[2] = {{src, N / 4}, {src + N / 4, N / 4}};
  CHECK(writev(fd, wv, 2) == (ssize_t)(N / 2), "writev");
  CHECK(pwritev(fd, wv, 2, N / 2) == (ssize_t)(N / 2), "pwritev");
  reset_dst();
  CHECK(pread(fd, dst, N / 2, 0) == (ssize_t)(N / 2) && same(N / 2), "after writev");
  /* No loop here: programs trust a regular file's full count. */
  r = pread(fd, dst + N / 2, N / 2, N / 2);
  CHECK(r == (ssize_t)(N / 2) && !memcmp(dst + N / 2, src, N / 2), "after pwritev: pread returned %zd", r);
  close(fd);

  /* stdio: glibc moves large requests straight between the buffer and the file. */
  push_out();
  FILE *f = fopen(path, "w");
  CHECK(f && fwrite(src, 1, N, f) == N && !ferror(f), "fwrite");
  if (f) fclose(f);
  reset_dst();
  f = fopen(path, "r");
  size_t got = f ? fread(dst, N, 1, f) : 0;
  CHECK(got == 1 && same(N) && !ferror(f), "fread returned %zu", got);
  if (f) fclose(f);
  unlink(path);

  /* A pipe: a writer thread, a reader that loops on short reads. */
  int p[2]; CHECK(pipe(p) == 0, "pipe");
  struct pipe_job j = {p[1], N / 4};
  reset_dst();
  pthread_t t; pthread_create(&t, NULL, pipe_writer, &j);
  CHECK(read_all(p[0], dst, N / 4) == N / 4 && same(N / 4), "pipe");
  pthread_join(t, NULL); close(p[0]);

  /* A stream socket: send/recv, then sendmsg/recvmsg. */
  int sv[2]; CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
  struct pipe_job k = {sv[0], N / 4};
  reset_dst();
  pthread_create(&t, NULL, sock_sender, &k);
  size_t d = 0;
  while (d < N / 4) { ssize_t q = recv(sv[1], dst + d, N / 4 - d, 0); if (q <= 0) break; d += q; }
  CHECK(d == N / 4 && same(N / 4), "recv got %zu", d);
  pthread_join(t, NULL); close(sv[0]); close(sv[1]);
  /* Datagrams: one message each way, whole. */
  CHECK(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) == 0, "socketpair dgram");
  int sz = 1 << 20; setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz); setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
  reset_dst();
  struct iovec mi = {src, 100000}, mo = {dst, 100000};
  struct msghdr ms = {.msg_iov = &mi, .msg_iovlen = 1}, mr = {.msg_iov = &mo, .msg_iovlen = 1};
  CHECK(sendmsg(sv[0], &ms, 0) == 100000, "sendmsg");
  CHECK(recvmsg(sv[1], &mr, 0) == 100000 && same(100000), "recvmsg");
  push_out();
  CHECK(sendto(sv[0], src, 50000, 0, NULL, 0) == 50000, "sendto");
  reset_dst();
  CHECK(recvfrom(sv[1], dst, 50000, 0, NULL, NULL) == 50000 && same(50000), "recvfrom");
  close(sv[0]); close(sv[1]);

  /* process_vm_readv into a managed buffer from an unmanaged one (as from a peer's). */
  static unsigned char peer[512 << 10];
  memcpy(peer, src, sizeof peer);
  reset_dst();
  struct iovec lo = {dst, sizeof peer}, re = {peer, sizeof peer};
  r = process_vm_readv(getpid(), &lo, 1, &re, 1, 0);
  CHECK(r == (ssize_t)sizeof peer && same(sizeof peer), "process_vm_readv returned %zd", r);

  /* A genuinely bad pointer still fails with EFAULT, as without Attune. */
  fd = open("/dev/zero", O_RDONLY);
  errno = 0;
  r = read(fd, (void *)16, 4096);
  CHECK(r == -1 && errno == EFAULT, "read into a bad pointer returned %zd", r);
  close(fd);

  free(src); free(dst); free(pressure);
  if (bad) { printf("syscalls_io: %d FAILED\n", bad); return 1; }
  printf("syscalls_io: OK\n");
  return 0;
}
