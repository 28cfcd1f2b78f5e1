/* Loads a Go c-shared library (tests/run/go_shared.go) and imports a POSIX AIO call, so
 * that the loader scan's first find is the program's import and the Go runtime is only in
 * a later object. argv[1] = MiB of the buffer the library fills (default 96). */
#include <aio.h>
#include <stdio.h>
#include <stdlib.h>

extern int GoWork(int mib);

int main(int argc, char **argv) {
    int mib = argc > 1 ? atoi(argv[1]) : 96;
    /* Never taken: the import is what counts (glibc's POSIX AIO). */
    if (argc > 99) aio_read(NULL);
    if (GoWork(mib) != 0) return 1;
    printf("go_shared: OK %d MiB\n", mib);
    return 0;
}
