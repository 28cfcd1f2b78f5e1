#!/bin/bash
# Programs nobody here wrote, under `attune run -q --dram ${DRAM:-16M}`: gcc on a generated
# 6,000-function file (its GC heap is mmap'ed), perl, sqlite3, a sort pipeline, node,
# pandas, git log, xz, jq, Tcl, lz4 and bzip2, a Go program built with cgo (tiered under the
# handler thread; untiered, with a warning, for a user: docs/design/run.md). Each runs
# first without Attune: one line each with the exit status, seconds with and without,
# whether the output is the same, and any error line. Outputs in $W (a new directory
# under /tmp unless set). Run it as root and as `runuser -u nobody -- env HOME=/tmp bench/run_battery.sh`; ONLY="a b"
# runs those alone. docs/benchmarks.md quotes the gcc line (with `--fault-mode signal` and
# `auto` by hand) and the last run of the whole battery.
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ATT=${ATT:-$ROOT/build/bin/attune}
W=${W:-$(mktemp -d /tmp/attune-battery.XXXXXX)}; chmod 755 "$W"
cd "$W"
u=$(id -u)
run() { # name cmd...
  local name=$1; shift
  [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]] && return
  local t0=$(date +%s.%N)
  "$@" > $W/$name.$u.plain 2>/dev/null
  local t1=$(date +%s.%N)
  "$ATT" run -q --dram ${DRAM:-16M} -- "$@" > $W/$name.$u.out 2> $W/$name.$u.err
  local rc=$?
  local t2=$(date +%s.%N)
  local same=same; cmp -s $W/$name.$u.plain $W/$name.$u.out || same=OUTPUT-DIFFERS
  printf "%-10s rc=%-3s %5.1fs (alone %4.1fs) %-14s %s\n" "$name" "$rc" "$(echo "$t2 - $t1" | bc)" \
    "$(echo "$t1 - $t0" | bc)" "$same" \
    "$(grep -iE "error|fault|bad address|killed" $W/$name.$u.err | head -2 | tr '\n' ' ' | cut -c1-200)"
}
[ -f big.c ] || python3 -c "
print('#include <stdio.h>')
for i in range(6000): print(f'static int f{i}(int x) {{ int a[64]; for (int j = 0; j < 64; j++) a[j] = x * j + {i}; return a[x & 63] + (x > 1 ? f{max(i-1,0)}(x - 1) : 0); }}')
print('int main(void) { printf(\"%d\\\\n\", f5999(3)); return 0; }')" > big.c
run gcc gcc -O1 -c big.c -o /dev/null
run perl perl -e 'my %h; for my $i (1..800000) { $h{"key$i"} = "v" x 40 . $i } opendir(my $d, "/tmp") or die "opendir: $!"; my @e = readdir($d); my $n = 0; for my $i (1..800000) { $n++ if $h{"key$i"} eq "v" x 40 . $i } print "perl: $n ", scalar(@e) > 0 ? "ok" : "bad", "\n"'
run sqlite sqlite3 :memory: "create table t(a integer, b text); with recursive c(x) as (select 1 union all select x+1 from c where x < 400000) insert into t select x, hex(randomblob(32)) from c; create index i on t(b); select count(*), sum(length(b)) from t;"
run sort sh -c "seq 1 2000000 | awk '{print (\$1*7919)%1000003, \$1}' | sort -n | tail -1"
run node node -e 'const m = new Map(); for (let i = 0; i < 600000; i++) m.set("k" + i, {v: "x".repeat(40) + i}); const fs = require("fs"); const e = fs.readdirSync("/tmp"); let n = 0; for (let i = 0; i < 600000; i++) if (m.get("k" + i).v.endsWith(String(i))) n++; console.log("node:", n, e.length > 0)'
run pandas python3 -c '
import pandas as pd, numpy as np, os
n = 600000
df = pd.DataFrame({"k": [f"key{i%5000}" for i in range(n)], "v": np.arange(n, dtype=np.float64)})
g = df.groupby("k")["v"].sum()
names = os.listdir("/tmp"); st = [os.stat("/tmp") for _ in range(100)]
print("pandas:", len(g), g.sum() == df["v"].sum())'
run git git -C "$ROOT" log --oneline -2000 --stat
run xz sh -c "head -c 60000000 /dev/urandom | xz -T1 -1 | xz -d | wc -c"
[ -f big.json ] || python3 -c 'import json; print(json.dumps([{"k": i, "v": "x" * 20 + str(i)} for i in range(300000)]))' > big.json
run jq jq '([.[] | .k] | add), ([.[] | .v | length] | add)' big.json
run tcl sh -c 'echo "set d [dict create]; for {set i 0} {\$i < 400000} {incr i} { dict set d k\$i [string repeat x 30]\$i }; set n 0; dict for {k v} \$d { incr n [string length \$v] }; puts \$n" | tclsh'
run lz4bz2 sh -c "head -c 20000000 /dev/zero | tr '\\0' 'a' | lz4 -1 | lz4 -d | bzip2 -1 | bzip2 -d | md5sum"
if [ -z "$ONLY" ] || [[ " $ONLY " == *" go "* ]]; then
  GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
  [ -x "$GO" ] && [ ! -x go_cgo ] && HOME=$W GOCACHE=$W/gocache GOPATH=$W/gopath CGO_ENABLED=1 \
    "$GO" build -o go_cgo "$ROOT/tests/run/go_cgo.go" 2>/dev/null
  [ -x go_cgo ] && run go ./go_cgo 96
fi
