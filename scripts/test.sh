#!/usr/bin/env bash
# Runs every test: Rust unit and integration tests, then the native tests (C, C++,
# Fortran, CMake and pkg-config consumers) against the staged build/ prefix.
# Ends with one line "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
PREFIX=$ROOT/build
export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
OUT=$(mktemp -d /tmp/attune-test.XXXXXX)
trap 'umount "$OUT/full" 2>/dev/null; rm -rf "$OUT"' EXIT
pass=0; fail=0; failed=()

run() { # run NAME CMD...: one native test
  local name=$1; shift
  if timeout 300 "$@" >"$OUT/$name.log" 2>&1; then
    pass=$((pass+1)); echo "ok   $name $(grep -h -m1 -E '^(integrity|stress):' "$OUT/$name.log" || true)"
  else
    fail=$((fail+1)); failed+=("$name"); echo "FAIL $name"; tail -n 20 "$OUT/$name.log" | sed 's/^/     /'
  fi
}

echo "== Rust tests"
if cargo test --release --workspace 2>&1 | tee "$OUT/cargo.log" | grep -E '^test result|FAILED|panicked' ; then :; fi
rust_pass=$(grep -E '^test result' "$OUT/cargo.log" | sed -E 's/.* ([0-9]+) passed.*/\1/' | awk '{s+=$1} END {print s+0}')
rust_fail=$(grep -E '^test result' "$OUT/cargo.log" | sed -E 's/.* ([0-9]+) failed.*/\1/' | awk '{s+=$1} END {print s+0}')
if ! grep -q '^test result' "$OUT/cargo.log" || grep -qE '^error(\[|:)' "$OUT/cargo.log"; then rust_fail=$((rust_fail+1)); failed+=(cargo-test); fi
pass=$((pass+${rust_pass:-0})); fail=$((fail+${rust_fail:-0}))

echo "== native tests (pkg-config and CMake consumers of $PREFIX)"
CFLAGS="-O2 -g $(pkg-config --cflags attune) -Itests/c"
LIBS="$(pkg-config --libs attune) -Wl,-rpath,$PREFIX/lib -lpthread"
for t in smoke integrity errors stress fork_exec signal_mode small config_error fallback; do
  gcc $CFLAGS tests/c/$t.c -o "$OUT/$t" $LIBS || { fail=$((fail+1)); failed+=("build-$t"); }
done
g++ -O2 -std=c++17 $(pkg-config --cflags attune) tests/cpp/threads.cpp -o "$OUT/cpp_threads" $LIBS || { fail=$((fail+1)); failed+=(build-cpp); }
(cd "$OUT" && gfortran -O2 -c "$PREFIX/include/attune.f90" && gfortran -O2 -I. "$ROOT/tests/fortran/basic.f90" attune.o -o fortran_basic $LIBS) || { fail=$((fail+1)); failed+=(build-fortran); }

export ATTUNE_DRAM=16M TEST_BUDGET=$((16<<20))
run smoke "$OUT/smoke"
for chunk in 4K 64K 2M; do
  ATTUNE_CHUNK_SIZE=$chunk run "integrity-memory-$chunk" "$OUT/integrity" 48
done
ATTUNE_FAULT_MODE=signal run integrity-memory-signal "$OUT/integrity" 48
ATTUNE_FAULT_MODE=signal ATTUNE_CHUNK_SIZE=64K run integrity-memory-signal-64K "$OUT/integrity" 48
# The file tier alone (NVMe/Lustre-like), at several chunk sizes.
cat > "$OUT/file.toml" <<TOML
dram = "16M"
[[tier]]
name = "ssd"
kind = "file"
path = "$OUT"
capacity = "1G"
TOML
for chunk in 4K 64K 2M; do
  ATTUNE_CONFIG="$OUT/file.toml" ATTUNE_CHUNK_SIZE=$chunk run "integrity-file-$chunk" "$OUT/integrity" 48
done
ATTUNE_CONFIG="$OUT/file.toml" ATTUNE_TIER_SSD_DIRECT=true ATTUNE_CHUNK_SIZE=64K run integrity-file-direct "$OUT/integrity" 48
# Flags: LAT and CAP regions.
run integrity-lat "$OUT/integrity" 48 1
run integrity-cap "$OUT/integrity" 48 4
run stress "$OUT/stress" 64
ATTUNE_FAULT_MODE=signal run stress-signal "$OUT/stress" 64
run errors "$OUT/errors"
run fork_exec "$OUT/fork_exec"
run signal_mode "$OUT/signal_mode"
run small "$OUT/small"
run config_error "$OUT/config_error"
ATTUNE_DISABLE_UFFD=1 run fallback-plain-dram "$OUT/fallback"
run cpp_threads "$OUT/cpp_threads"
run fortran_basic "$OUT/fortran_basic"
# No file left behind by the file tier, even after SIGKILL.
before=$(ls -A "$OUT" | wc -l)
( ATTUNE_CONFIG="$OUT/file.toml" "$OUT/integrity" 64 & p=$!; sleep 0.5; kill -9 $p; wait $p ) >/dev/null 2>&1
after=$(ls -A "$OUT" | wc -l)
if [ "$before" = "$after" ]; then pass=$((pass+1)); echo "ok   no-leftover-files-after-sigkill"; else fail=$((fail+1)); failed+=(leftover-files); echo "FAIL leftover files"; fi
# A full disk under the file tier: ENOSPC reported, no data lost.
mkdir -p "$OUT/full"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=8m tmpfs "$OUT/full" 2>/dev/null; then
  cat > "$OUT/full.toml" <<TOML
dram = "16M"
[[tier]]
name = "fast"
kind = "memory"
capacity = "8M"
[[tier]]
name = "ssd"
kind = "file"
path = "$OUT/full"
capacity = "1G"
TOML
  ATTUNE_CONFIG="$OUT/full.toml" EXPECT_TIER_FULL=1 run file-tier-full "$OUT/integrity" 48
  umount "$OUT/full"
else
  echo "skip file-tier-full (needs root to mount a small tmpfs)"
fi
if command -v cmake >/dev/null; then
  if cmake -S tests/cmake -B "$OUT/cmake" -DCMAKE_PREFIX_PATH="$PREFIX" >"$OUT/cmake.log" 2>&1 && cmake --build "$OUT/cmake" >>"$OUT/cmake.log" 2>&1; then
    run cmake-shared "$OUT/cmake/smoke_shared"
    run cmake-static "$OUT/cmake/smoke_static"
  else
    fail=$((fail+1)); failed+=(cmake); tail "$OUT/cmake.log"
  fi
fi
unset ATTUNE_DRAM TEST_BUDGET

if [ -d tests/python ] && command -v python3 >/dev/null; then
  echo "== Python tests"
  python3 -m pytest -q tests/python 2>&1 | tee "$OUT/pytest.log" | tail -n 3
  pp=$(grep -oE '[0-9]+ passed' "$OUT/pytest.log" | grep -oE '[0-9]+' || echo 0)
  pf=$(grep -oE '[0-9]+ (failed|error)' "$OUT/pytest.log" | grep -oE '[0-9]+' | awk '{s+=$1} END {print s+0}')
  pass=$((pass+${pp:-0})); fail=$((fail+${pf:-0}))
fi

[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "${pass} passed, ${fail} failed"
[ "$fail" -eq 0 ]
