#!/usr/bin/env bash
# The soak (tests/stress/soak.c) over every far-tier kind and under a budget that varies:
#   1. the memory tier, 16 MiB budget;
#   2. the file tier (NVMe/Lustre-like), 16 MiB budget;
#   3. under attuned (48 MiB pool), whose grant changes every 2 s as a neighbour workflow
#      of 40 MiB comes and goes;
#   4. the node's far pool held by attuned (32 MiB far pool), whose far grant and pool
#      segment grow and shrink every 2 s as a neighbour with a pool tier comes and goes,
#      the rest spilling to a file tier;
#   5. the remote tier: two `attune memserver`s on this host's loopback, each page kept on
#      both (replicas = 2), the first stopped for 2.6 s every 6 s, the second killed every
#      7 s and started again (empty) a second later, the rest spilling to a file tier; no forks in this run (a child cannot see pages its parent holds
#      remotely: docs/design/remote.md);
#   6. as an unprivileged user where this script runs as root (a user-mode-only
#      userfaultfd where vm.unprivileged_userfaultfd=0).
# Each region the soak allocates takes a random chunk size and fault delivery.
#
#   tests/stress/soak.sh [--time SECONDS]   total time, split over the six (default 120)
#
# Needs the staged build (make build). Prints each run's "soak:" line and a total;
# exits 1 on any wrong byte or any runtime error line. docs/reliability.md has the long run's figures.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD; PREFIX=$ROOT/build
total=120
[ "${1:-}" = --time ] && total=$2
part=$(( total / 6 )); [ $part -lt 5 ] && part=5
OUT=$(mktemp -d /tmp/attune-soak.XXXXXX); chmod 755 "$OUT"
pids=()
cleanup() {
  # A paused server (the remote run's) must be resumed to take SIGTERM.
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; kill -CONT "$p" 2>/dev/null; done
  wait 2>/dev/null; rm -rf "$OUT"
}
trap cleanup EXIT
gcc -O2 -g -I"$PREFIX/include" -I"$ROOT/tests/c" tests/stress/soak.c -o "$OUT/soak" \
  -L"$PREFIX/lib" -lattune -Wl,-rpath,"$PREFIX/lib" -lpthread || exit 1
gcc -O2 -I"$PREFIX/include" -I"$ROOT/tests/c" tests/daemon/client.c -o "$OUT/client" \
  -L"$PREFIX/lib" -lattune -Wl,-rpath,"$PREFIX/lib" -lpthread || exit 1
status=0; moved=0; checks=0
ssd_tier() { # the file tier every configuration below ends with
  printf '[[tier]]\nname = "ssd"\nkind = "file"\npath = "%s"\ncapacity = "4G"' "$OUT"
}
soak() { # soak NAME [env...]: one run of $part seconds
  local name=$1; shift
  if env SOAK_SECONDS=$part "$@" >"$OUT/$name.log" 2>&1; then :; else status=1; fi
  local line; line=$(grep -E '^soak: [0-9]+ threads' "$OUT/$name.log" || true)
  echo "$name: ${line:-no result}"
  [ -z "$line" ] && status=1
  # A page the runtime could not read back is a failure even when no thread saw it.
  grep -q '^attune: error:' "$OUT/$name.log" && status=1
  grep -vE '^soak: [0-9]+ threads' "$OUT/$name.log" | head -5 | sed 's/^/    /'
  # A run without its line (killed) adds nothing: ${n:-0}.
  local n
  n=$(sed -n 's/.* \([0-9]*\) pages moved.*/\1/p' <<<"$line" | head -1)
  moved=$(( moved + ${n:-0} ))
  n=$(sed -n 's/.*: \([0-9]*\) page checks.*/\1/p' <<<"$line" | head -1)
  checks=$(( checks + ${n:-0} ))
}
soak memory-tier ATTUNE_DRAM=16M ATTUNE_DAEMON=off "$OUT/soak"
cat >"$OUT/file.toml" <<TOML
dram = "16M"
daemon = "off"
$(ssd_tier)
TOML
soak file-tier ATTUNE_CONFIG="$OUT/file.toml" "$OUT/soak"
sock=$OUT/attuned.sock
"$PREFIX/bin/attuned" --socket "$sock" --dram 48M --min-grant 8M --metrics off >"$OUT/attuned.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
( end=$((SECONDS + part)); while [ $SECONDS -lt $end ]; do
    ATTUNE_SOCKET=$sock ATTUNE_DRAM=40M "$OUT/client" workflow CAP 40 2 >/dev/null 2>&1; sleep 2; done ) &
pids+=($!)
soak varying-budget ATTUNE_SOCKET="$sock" ATTUNE_DAEMON=require ATTUNE_DRAM=48M "$OUT/soak"
kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; pids=()
cat >"$OUT/pool.toml" <<TOML
[[tier]]
name = "pool"
kind = "pool"
capacity = "1G"
$(ssd_tier)
TOML
psock=$OUT/attuned-pool.sock
"$PREFIX/bin/attuned" --socket "$psock" --dram 256M --far-pool 32M --min-grant 4M --metrics off >"$OUT/attuned-pool.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$psock" ] && break; sleep 0.05; done
( end=$((SECONDS + part)); while [ $SECONDS -lt $end ]; do
    ATTUNE_SOCKET=$psock ATTUNE_CONFIG=$OUT/pool.toml ATTUNE_DRAM=8M "$OUT/client" workflow CAP 40 2 >/dev/null 2>&1; sleep 2; done ) &
pids+=($!)
soak node-pool ATTUNE_SOCKET="$psock" ATTUNE_DAEMON=require ATTUNE_CONFIG="$OUT/pool.toml" ATTUNE_DRAM=16M "$OUT/soak"
kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; pids=()
"$PREFIX/bin/attune" memserver --new-secret "$OUT/secret" >/dev/null || status=1
port=$(( 20000 + $$ % 20000 ))
servers=""
for p in $port $((port + 1)); do
  "$PREFIX/bin/attune" memserver --listen 127.0.0.1:$p --secret-file "$OUT/secret" --size 256M >"$OUT/memserver-$p.log" 2>&1 &
  pids+=($!)
  servers="$servers${servers:+,}127.0.0.1:$p"
done
for p in $port $((port + 1)); do
  for _ in $(seq 200); do grep -q serving "$OUT/memserver-$p.log" 2>/dev/null && break; sleep 0.05; done
done
cat >"$OUT/remote.toml" <<TOML
dram = "16M"
daemon = "off"
[[tier]]
name = "remote"
kind = "remote"
capacity = "512M"
servers = "$servers"
secret_file = "$OUT/secret"
replicas = 2
$(ssd_tier)
TOML
# The first server stops for 2.6 s every 6 s (a server paused by its host, less than the
# 5 s timeout): the runtime moves to a new endpoint, and what it sent from the old one
# arrives late (docs/design/remote.md, "Requests from an old endpoint").
paused=${pids[0]}
( while :; do sleep 3.4; kill -STOP "$paused"; sleep 2.6; kill -CONT "$paused"; done ) &
pauser=$!
# The second server is killed every 7 s and started again, empty, a second later: the
# runtime loses it, asks it back and makes its copies again from the first while idle
# (docs/design/remote.md, "Copies made again after a rejoin"). Every page keeps its copy
# on the first, which is only paused. The restarter ends the server it started last.
second=$((port + 1))
echo "${pids[1]}" >"$OUT/second.pid"
disown "${pids[1]}"
pids=("${pids[0]}")  # the restarter owns the second server from here
( trap 'kill "$(cat "$OUT/second.pid")" 2>/dev/null; exit 0' TERM
  while :; do
    sleep 7 & wait $!
    kill -KILL "$(cat "$OUT/second.pid")" 2>/dev/null
    : >"$OUT/second.pid"
    sleep 1 & wait $!
    "$PREFIX/bin/attune" memserver --listen 127.0.0.1:$second --secret-file "$OUT/secret" --size 256M \
      >>"$OUT/memserver-$second.log" 2>&1 &
    echo $! >"$OUT/second.pid"
    disown  # killed on purpose: no "Killed" line from bash
  done ) &
restarter=$!
pids+=("$pauser" "$restarter")
soak remote-tier SOAK_FORKS=0 ATTUNE_CONFIG="$OUT/remote.toml" "$OUT/soak"
kill "$pauser" "$restarter" 2>/dev/null; wait "$pauser" "$restarter" 2>/dev/null
pids=("$paused")
kill -CONT "$paused" 2>/dev/null
grep -c "copies made again" "$OUT/remote-tier.log" | sed 's/^/    passes of copies made again: /'
kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; pids=()
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
  soak unprivileged runuser -u nobody -- env ATTUNE_DRAM=16M ATTUNE_DAEMON=off "$OUT/soak"
else
  soak unprivileged-as-$(id -un) ATTUNE_DRAM=16M ATTUNE_DAEMON=off "$OUT/soak"
fi
echo "soak total: $checks page checks, $moved pages moved between tiers, $([ $status = 0 ] && echo 0 || echo some) wrong"
exit $status
