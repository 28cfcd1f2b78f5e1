/* Runs a program under a seccomp filter that refuses some system calls with EPERM, the
 * way a container's seccomp profile does: the real mechanism behind the runtime's
 * fallbacks, not a switch in the runtime.
 *
 *   deny_syscalls NAME[,NAME...] -- PROGRAM [ARGS...]
 *
 * NAME: userfaultfd (the system call), uffd-dev (the USERFAULTFD_IOC_NEW ioctl of
 * /dev/userfaultfd), uffdio-move, uffdio-poison and uffdio-writeprotect (those
 * userfaultfd ioctls: a feature the kernel offers but refuses), process_madvise, pidfd_open. Before it executes PROGRAM it checks
 * that each refusal is in force (a filter that silently did nothing would make the test
 * that uses it pass for the wrong reason). x86-64 only; exits 77 elsewhere. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <fcntl.h>

#define USERFAULTFD_IOC_NEW 0xAA00
#define UFFDIO_MOVE_CMD 0xC028AA05u   /* _IOWR(0xAA, 0x05, struct uffdio_move) */
#define UFFDIO_POISON_CMD 0xC020AA08u /* _IOWR(0xAA, 0x08, struct uffdio_poison) */
#define UFFDIO_WP_CMD 0xC018AA06u     /* _IOWR(0xAA, 0x06, struct uffdio_writeprotect) */

#ifndef SYS_process_madvise
#define SYS_process_madvise 440
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

static int usage(void) {
    fprintf(stderr, "usage: deny_syscalls userfaultfd|uffd-dev|uffdio-move|uffdio-poison|uffdio-writeprotect|process_madvise|pidfd_open[,...] -- PROGRAM [ARGS...]\n");
    return 2;
}

int main(int argc, char **argv) {
#if !defined(__x86_64__)
    fprintf(stderr, "deny_syscalls: x86-64 only\n");
    return 77;
#else
    if (argc < 4 || strcmp(argv[2], "--") != 0) return usage();
    int deny_uffd = 0, deny_pm = 0, deny_pidfd = 0;
    unsigned cmds[8];
    int ncmd = 0;
    char *names = strdup(argv[1]), *save = NULL;
    for (char *n = strtok_r(names, ",", &save); n; n = strtok_r(NULL, ",", &save)) {
        if (!strcmp(n, "userfaultfd")) deny_uffd = 1;
        else if (ncmd == 8) return usage();
        else if (!strcmp(n, "uffd-dev")) cmds[ncmd++] = USERFAULTFD_IOC_NEW;
        else if (!strcmp(n, "uffdio-move")) cmds[ncmd++] = UFFDIO_MOVE_CMD;
        else if (!strcmp(n, "uffdio-poison")) cmds[ncmd++] = UFFDIO_POISON_CMD;
        else if (!strcmp(n, "uffdio-writeprotect")) cmds[ncmd++] = UFFDIO_WP_CMD;
        else if (!strcmp(n, "process_madvise")) deny_pm = 1;
        else if (!strcmp(n, "pidfd_open")) deny_pidfd = 1;
        else { fprintf(stderr, "deny_syscalls: unknown name %s\n", n); return usage(); }
    }
    struct sock_filter f[32];
    int k = 0;
#define LD(off) f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (off))
#define DENY_IF(nr) do { f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1); \
        f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM); } while (0)
    LD(offsetof(struct seccomp_data, arch));
    f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
    f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    LD(offsetof(struct seccomp_data, nr));
    if (deny_uffd) DENY_IF(SYS_userfaultfd);
    if (deny_pm) DENY_IF(SYS_process_madvise);
    if (deny_pidfd) DENY_IF(SYS_pidfd_open);
    if (ncmd) {
        /* ioctl(fd, CMD, ...): the low word of the second argument. Not an ioctl: skip the
         * load and the tests, to ALLOW. */
        f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ioctl, 0, 1 + 2 * ncmd);
        LD(offsetof(struct seccomp_data, args[1]));
        for (int i = 0; i < ncmd; i++) {
            f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, cmds[i], 0, 1);
            f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
        }
    }
    f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog prog = {.len = (unsigned short)k, .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        perror("deny_syscalls: installing the seccomp filter");
        return 1;
    }
    /* Each refusal is in force: EPERM where the kernel would have said something else. */
    int bad = 0;
    if (deny_uffd) { errno = 0; bad |= syscall(SYS_userfaultfd, O_CLOEXEC) != -1 || errno != EPERM; }
    if (deny_pm) { errno = 0; bad |= syscall(SYS_process_madvise, -1, NULL, 0, 4, 0) != -1 || errno != EPERM; }
    if (deny_pidfd) { errno = 0; bad |= syscall(SYS_pidfd_open, getpid(), 0) != -1 || errno != EPERM; }
    for (int i = 0; i < ncmd; i++) { errno = 0; bad |= ioctl(-1, cmds[i], 0) != -1 || errno != EPERM; }
    if (bad) { fprintf(stderr, "deny_syscalls: a refusal is not in force\n"); return 1; }
    execvp(argv[3], argv + 3);
    perror("deny_syscalls: exec");
    return 127;
#endif
}
