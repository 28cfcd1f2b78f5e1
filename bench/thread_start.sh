#!/usr/bin/env bash
# Cost of a thread's start and end under the interposer's pthread_create: bench/thread_start.c
# (THREADS threads started and joined one at a time) bare, under `attune run` (libc's
# pthread_create behind one load) and under `attune profile` (each thread claims a clock
# slot as it begins, reads its clock and its schedstat as it ends), alternated ROUNDS
# times. Prints each case's median ns a thread and its ratio to bare.
set -eu
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5} THREADS=${THREADS:-20000}
ATT=build/bin/attune
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export ATTUNE_HISTORY="$T/history.json"  # not the user's
gcc -O2 -pthread bench/thread_start.c -o "$T/thread_start"
for i in $(seq "$ROUNDS"); do
  "$T/thread_start" "$THREADS" | sed -n 's/thread_start: \([0-9]*\) ns.*/bare \1/p'
  $ATT run -q --dram 1G -- "$T/thread_start" "$THREADS" | sed -n 's/thread_start: \([0-9]*\) ns.*/run \1/p'
  $ATT profile --out "$T/p" --dram 1G -- "$T/thread_start" "$THREADS" 2>/dev/null | sed -n 's/thread_start: \([0-9]*\) ns.*/profile \1/p'
done | python3 -c '
import sys, statistics as st
d = {}
for l in sys.stdin:
    k, v = l.split(); d.setdefault(k, []).append(int(v))
b = st.median(d["bare"])
for k in ("bare", "run", "profile"):
    m = st.median(d[k])
    print("%-8s median %6.0f ns a thread (%.2fx bare) %s" % (k, m, m / b, d[k]))'
