/* Secure execution: run set-user-ID by another user, a program linked with libattune
 * must not take settings from the caller's ATTUNE_* environment (ATTUNE_CONFIG would
 * make it read, and show in errors, a file only the program's owner may read). Built
 * statically (the loader ignores LD_LIBRARY_PATH for such a program). Prints
 * "secure_env: OK" when a managed allocation works. */
#include <attune.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    size_t n = 1u << 20;
    char *p = allocate_TM(n, 0);
    if (!p) {
        printf("secure_env: allocation failed: %s\n", attune_last_error());
        return 1;
    }
    memset(p, 1, n);
    free_TM(p);
    printf("secure_env: OK\n");
    return 0;
}
