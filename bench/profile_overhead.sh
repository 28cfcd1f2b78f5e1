#!/usr/bin/env bash
# Cost of attune profile's access sampler: the same time-bounded random-access program
# (tests/run/skewed.c, 128 MiB, 10% of pages take 90%) under `attune run` and under
# `attune profile` (1000 samples/s, 4K chunks), alternated PAIRS times; accesses done in
# SECONDS each. Prints both medians and the ratio.
set -eu
cd "$(dirname "$0")/.."
PAIRS=${PAIRS:-5} SECONDS_RUN=${SECONDS_RUN:-5}
ATT=build/bin/attune
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
gcc -O2 tests/run/skewed.c -o "$T/skewed"
for i in $(seq "$PAIRS"); do
  $ATT run -q --chunk 4K --dram 1G -- "$T/skewed" 128 "$SECONDS_RUN" | sed -n 's/.*accesses=\([0-9]*\).*/run \1/p'
  $ATT profile --out "$T/p" --dram 1G -- "$T/skewed" 128 "$SECONDS_RUN" | sed -n 's/.*accesses=\([0-9]*\).*/profile \1/p'
done | python3 -c '
import sys, statistics as st
d = {}
for l in sys.stdin:
    k, v = l.split(); d.setdefault(k, []).append(int(v))
r, p = st.median(d["run"]), st.median(d["profile"])
print("attune run: median %.1f M accesses %s" % (r / 1e6, d["run"]))
print("attune profile: median %.1f M accesses %s" % (p / 1e6, d["profile"]))
pairs = sorted(b / a for a, b in zip(d["run"], d["profile"]))
print("overhead: %.1f%% fewer accesses (medians), %.1f%% (median of the pairs)" % (100 * (1 - p / r), 100 * (1 - st.median(pairs))))'
