/* skewed.c with its buffer from Attune's C API (allocate_TM/free_TM) instead of malloc: a
 * program linked against libattune, for `attune profile` and `attune run` (its calls bind
 * to the interposer's copy of the API, so one runtime serves and reports them). */
#include <attune.h>
#include <stdlib.h>
#define malloc(n) allocate_TM((n), 0)
#define free(p) free_TM(p)
#include "skewed.c"
