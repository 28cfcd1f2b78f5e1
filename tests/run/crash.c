/* attune run test: a program that dies. "segv" touches NULL after using managed memory;
 * "exit N" exits with N; "kill SIG" kills itself; "sleep" waits to be killed. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
  char *p = malloc(32 << 20);
  memset(p, 1, 32 << 20);
  const char *what = argc > 1 ? argv[1] : "exit";
  int arg = argc > 2 ? atoi(argv[2]) : 0;
  if (!strcmp(what, "segv")) { volatile int *z = 0; return *z; }
  if (!strcmp(what, "kill")) raise(arg);
  if (!strcmp(what, "sleep")) { for (;;) pause(); }
  return arg;
}
