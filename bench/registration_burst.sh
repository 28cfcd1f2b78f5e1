#!/usr/bin/env bash
# How many registrations a busy attuned answers after the runtime's 2 s (issue 26;
# docs/design/daemon.md, "A late welcome"): N Charliecloud instances of one staged
# SquashFS image start at once, and each one's runtimes log whether the welcome was late.
# Root (ch-run's SquashFUSE needs /dev/fuse), after `make build`; ch-run, mksquashfs and
# busybox from scripts/setup.sh.
# Usage: bench/registration_burst.sh [COUNTS...]   (default: 25 50 100 150)
# ATTUNED=PATH runs another build's daemon (an A/B pair: the runtimes stay this build's).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
A=$ROOT/build/bin/attune
[ "$(id -u)" -eq 0 ] || { echo "registration_burst.sh: needs root (ch-run's SquashFUSE opens /dev/fuse)" >&2; exit 2; }
for t in ch-run mksquashfs busybox bc; do
  command -v "$t" >/dev/null || { echo "registration_burst.sh: $t not installed (scripts/setup.sh)" >&2; exit 2; }
done
[ -x "$A" ] || { echo "registration_burst.sh: no $A (make build)" >&2; exit 2; }
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(25 50 100 150)
for m in "${counts[@]}"; do
  [[ "$m" =~ ^[1-9][0-9]*$ ]] || { echo "registration_burst.sh: a count is a positive integer, not '$m'" >&2; exit 2; }
done
W=$(mktemp -d /tmp/attune-burst-XXXXXX)
D=
cleanup() { [ -n "$D" ] && kill "$D" 2>/dev/null && wait "$D" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
python3 -c "import sys, os; sys.path.insert(0, '$ROOT/tests/python')
from test_stage import squashfs_image; squashfs_image('$W', os.urandom(16 << 20))"
export USER=root ATTUNE_SOCKET=$W/d.sock ATTUNE_LOG=info
"${ATTUNED:-$ROOT/build/bin/attuned}" --socket "$W/d.sock" --dram 4G --shared-max 1G --metrics off > "$W/d.log" 2>&1 &
D=$!
for _ in $(seq 100); do [ -S "$W/d.sock" ] && break; sleep 0.05; done
"$A" stage img "$W/image.sqfs" > /dev/null
# The daemon's work over a burst: rebalances and the grants they pushed.
work() { "$A" status --json | python3 -c 'import json, sys; s = json.load(sys.stdin); print(s["rebalances"], s.get("grants_pushed", 0))'; }
echo "| instances | makespan (s) | verified | welcomes | late (> 2 s) | warnings | rebalances | grants pushed |"
echo "|---|---|---|---|---|---|---|---|"
for m in "${counts[@]}"; do
  rm -f "$W"/out.*
  read -r r0 g0 < <(work)
  t0=$(date +%s.%N)
  pids=()
  for i in $(seq "$m"); do
    ("$A" run -q --staged img -- sh -c 'ch-run "$ATTUNE_STAGED_IMG" -- /bin/md5sum /etc/input.dat') \
      > "$W/out.$i" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  t1=$(date +%s.%N)
  ok=$(cat "$W"/out.* | grep -c '  /etc/input.dat$' || true)
  joined=$(cat "$W"/out.* | grep -c 'joined attuned' || true)
  late=$(cat "$W"/out.* | grep -c 'has not answered the registration' || true)
  warn=$(cat "$W"/out.* | grep -c 'warning' || true)
  read -r r1 g1 < <(work)
  printf '| %d | %.2f | %d/%d | %d | %d | %d | %d | %d |\n' "$m" "$(echo "$t1 - $t0" | bc)" "$ok" "$m" "$joined" "$late" "$warn" \
    $((r1 - r0)) $((g1 - g0))
done
