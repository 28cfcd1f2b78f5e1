#!/usr/bin/env bash
# Builds the fuzz targets of fuzz/ (libFuzzer through libfuzzer-sys, on stable Rust: the
# coverage instrumentation cargo-fuzz would ask for, given as rustc flags) and runs each
# for a time budget; then replays every input that once failed (fuzz/regressions/).
#
#   scripts/fuzz.sh                      every target, 60 s each
#   scripts/fuzz.sh --time 3600 config   one target for an hour (the long run)
#   scripts/fuzz.sh --keep ...           grow fuzz/corpus/ with what the run found
#
# Prints one line per target, "fuzz TARGET: N executions in S s, C crashes"; a crash's
# input is saved in fuzz/artifacts/TARGET/ and the script exits 1. docs/reliability.md
# has the figures of the long runs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
time_s=60; keep=0; targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --time) time_s=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=$(sed -n 's/^name = "\([a-z_]*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^attune_fuzz$' || true)
[ ${#targets[@]} -eq 0 ] && read -r -a targets <<<"$(echo $all)"
for t in "${targets[@]}"; do
  grep -qx "$t" <<<"$all" || { echo "fuzz.sh: no target '$t' (targets: $(echo $all))" >&2; exit 2; }
done

host=$(rustc -vV | sed -n 's/^host: //p')
# --target keeps the flags off build scripts and proc macros, as cargo-fuzz does.
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares"
work=$(mktemp -d /tmp/attune-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
# A target that does not build fails the run: the binaries of an earlier build would
# otherwise be fuzzed in its place (a clean clone has none, a working tree stale ones).
if ! (cd fuzz && cargo build --release --locked --target "$host" --bins) >"$work/build.log" 2>&1; then
  echo "FAIL fuzz: the targets do not build"; grep -E '^error' -A7 "$work/build.log" | head -n 40
  exit 1
fi
grep -E '^warning: unused' -A5 "$work/build.log" || true
bin=$ROOT/fuzz/target/$host/release
status=0
for t in "${targets[@]}"; do
  [ -x "$bin/$t" ] || { echo "fuzz.sh: $t was not built" >&2; exit 1; }
  seeds=$ROOT/fuzz/corpus/$t
  mkdir -p "$seeds" "$ROOT/fuzz/artifacts/$t" "$work/$t"
  corpus=$work/$t; [ $keep = 1 ] && corpus=$seeds
  crashes=0
  # Every input that once failed must pass now.
  if compgen -G "$ROOT/fuzz/regressions/$t/*" >/dev/null; then
    if ! "$bin/$t" "$ROOT"/fuzz/regressions/$t/* >"$work/$t.regress.log" 2>&1; then
      echo "FAIL fuzz $t: a regression input fails again"; tail -n 30 "$work/$t.regress.log"
      crashes=$((crashes+1))
    fi
  fi
  "$bin/$t" -max_total_time="$time_s" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$ROOT/fuzz/artifacts/$t/" "$corpus" "$seeds" >"$work/$t.log" 2>&1 || crashes=$((crashes+1))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$work/$t.log" | tail -1)
  echo "fuzz $t: ${execs:-0} executions in ${secs:-$time_s} s, $crashes crashes"
  if [ "$crashes" -gt 0 ]; then
    status=1; grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$work/$t.log" | head -n 20 | sed 's/^/     /'
  fi
done
exit $status
