/* A broken configuration is refused with a message naming the key and the line. */
#define _GNU_SOURCE
#include <attune.h>
#include <errno.h>
#include <string.h>
#include "check.h"

int main(void) {
    char path[] = "/tmp/attune-config-XXXXXX";
    int fd = mkstemp(path);
    const char *text = "# test\ndram = \"64M\"\nchunk_size = \"3K\"\n";
    write(fd, text, strlen(text)); close(fd);
    errno = 0;
    CHECK(attune_init(path) == -1 && errno == EINVAL, "init with a bad chunk_size: errno %d", errno);
    const char *m = attune_last_error();
    CHECK(strstr(m, "chunk_size") && strstr(m, ":3"), "message names key and line: %s", m);
    CHECK(allocate_TM(1u << 20, 0) == NULL, "no runtime after a broken configuration");
    unlink(path);
    CHECK_DONE();
}
