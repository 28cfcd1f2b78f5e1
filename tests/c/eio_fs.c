/* A disk that fails its reads, for the file tier's failure rule (docs/reliability.md):
 * a FUSE file system that passes every operation through to a backing directory, except
 * that reads fail with EIO while FLAGFILE exists, as reads of a disk with bad sectors do.
 * Writes keep working, so what is written after the failure starts still lands. Reads
 * bypass the page cache (direct_io), so every read of the tier reaches this process.
 * (This machine's kernel has neither device-mapper's `error` target nor block-layer fault
 * injection.)
 *
 * Usage: eio_fs BACKING FLAGFILE MOUNTPOINT [FUSE options, e.g. -f -o allow_other] */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static int backing = -1;       /* the backing directory */
static const char *flag;       /* reads fail while this exists */
static unsigned long failed;   /* reads failed so far */

/* The backing path of a FUSE path ("/x" -> "x", "/" -> "."). */
static const char *rel(const char *path) { return path[1] ? path + 1 : "."; }

static void *fs_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    (void)conn;
    cfg->use_ino = 1;
    cfg->direct_io = 1;
    cfg->entry_timeout = cfg->attr_timeout = cfg->negative_timeout = 0;
    return NULL;
}

static int fs_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    int r = fi ? fstat(fi->fh, st) : fstatat(backing, rel(path), st, AT_SYMLINK_NOFOLLOW);
    return r == -1 ? -errno : 0;
}

static int fs_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    (void)off; (void)fi; (void)flags;
    int fd = openat(backing, rel(path), O_RDONLY | O_DIRECTORY);
    if (fd == -1) return -errno;
    DIR *d = fdopendir(fd);
    if (!d) { close(fd); return -errno; }
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st = {.st_ino = e->d_ino, .st_mode = (mode_t)e->d_type << 12};
        if (fill(buf, e->d_name, &st, 0, 0)) break;
    }
    closedir(d);
    return 0;
}

static int fs_create(const char *path, mode_t mode, struct fuse_file_info *fi) {
    int fd = openat(backing, rel(path), (fi->flags & ~O_DIRECT) | O_CREAT, mode);
    if (fd == -1) return -errno;
    /* The caller's owner: the kernel checked the directory's rights (default_permissions). */
    struct fuse_context *c = fuse_get_context();
    if (fchown(fd, c->uid, c->gid) == -1) { close(fd); return -errno; }
    fi->fh = fd;
    return 0;
}

static int fs_open(const char *path, struct fuse_file_info *fi) {
    int fd = openat(backing, rel(path), fi->flags & ~O_DIRECT);
    if (fd == -1) return -errno;
    fi->fh = fd;
    return 0;
}

static int fs_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)path;
    if (access(flag, F_OK) == 0) {
        if (failed++ == 0) fprintf(stderr, "eio_fs: failing reads from now on\n");
        return -EIO;
    }
    ssize_t n = pread(fi->fh, buf, size, off);
    return n == -1 ? -errno : (int)n;
}

static int fs_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)path;
    ssize_t n = pwrite(fi->fh, buf, size, off);
    return n == -1 ? -errno : (int)n;
}

static int fs_fallocate(const char *path, int mode, off_t off, off_t len, struct fuse_file_info *fi) {
    (void)path;
    return fallocate(fi->fh, mode, off, len) == -1 ? -errno : 0;
}

static int fs_truncate(const char *path, off_t size, struct fuse_file_info *fi) {
    int r = fi ? ftruncate(fi->fh, size) : truncate(rel(path), size);
    return r == -1 ? -errno : 0;
}

static int fs_unlink(const char *path) { return unlinkat(backing, rel(path), 0) == -1 ? -errno : 0; }

static int fs_rename(const char *from, const char *to, unsigned int flags) {
    if (flags) return -EINVAL;
    return renameat(backing, rel(from), backing, rel(to)) == -1 ? -errno : 0;
}

static int fs_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close(fi->fh);
    return 0;
}

static int fs_statfs(const char *path, struct statvfs *st) {
    (void)path;
    return fstatvfs(backing, st) == -1 ? -errno : 0;
}

static const struct fuse_operations ops = {
    .init = fs_init,
    .getattr = fs_getattr,
    .readdir = fs_readdir,
    .create = fs_create,
    .open = fs_open,
    .read = fs_read,
    .write = fs_write,
    .fallocate = fs_fallocate,
    .truncate = fs_truncate,
    .unlink = fs_unlink,
    .rename = fs_rename,
    .release = fs_release,
    .statfs = fs_statfs,
};

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: eio_fs BACKING FLAGFILE MOUNTPOINT [FUSE options]\n");
        return 2;
    }
    backing = open(argv[1], O_RDONLY | O_DIRECTORY);
    if (backing == -1 || fchdir(backing) == -1) { perror("eio_fs: backing directory"); return 2; }
    flag = argv[2];
    argv[2] = argv[0];
    return fuse_main(argc - 2, argv + 2, &ops, NULL);
}
