#!/usr/bin/env bash
# Boots the two-node NUMA guest (node 1 CPU-less, lower memory tier by HMAT) under QEMU
# TCG with Attune inside, runs scenarios.sh, and writes the serial log to $1 (default
# target/numa-guest.log). Needs root the first time (fetch.sh installs QEMU 10).
# Recipe and pitfalls: ../shared/notes/numa-vm.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
LOG=${1:-$ROOT/target/numa-guest.log}
ATTUNE=${ATTUNE_BIN:-$ROOT/target/release/attune}
KERNEL=$("$HERE/fetch.sh" | tail -1)
[ -x "$ATTUNE" ] || { echo "run.sh: $ATTUNE not built (cargo build --release)" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
R=$WORK/root
mkdir -p "$R"/{bin,sbin,etc,proc,sys,dev,tmp,lib64,usr/bin}
cp "$(command -v busybox)" "$R/bin/busybox"
cp "$ATTUNE" "$R/bin/attune"
# Shared libraries of the attune binary, at the paths the loader looks for them.
for lib in $(ldd "$ATTUNE" | grep -o '/[^ ]*'); do
  mkdir -p "$R$(dirname "$lib")"
  cp -L "$lib" "$R$lib"
done
cp "$HERE/init" "$R/init"
chmod +x "$R/init"
cp "$HERE/scenarios.sh" "$R/scenarios.sh"
cp "$HERE/attune.toml" "$R/etc/attune.toml"
(cd "$R" && find . | cpio -o -H newc --quiet | gzip -1) >"$WORK/initrd.gz"
mkdir -p "$(dirname "$LOG")"
BIOS=/usr/share/qemu/qboot.rom
[ -f "$BIOS" ] || BIOS=/usr/share/seabios/bios-256k.bin
timeout "${GUEST_TIMEOUT:-600}" qemu-system-x86_64 -accel tcg -machine pc,hmat=on -cpu qemu64 \
  -smp 2 -m 2G -bios "$BIOS" \
  -object memory-backend-ram,size=1G,id=m0 -object memory-backend-ram,size=1G,id=m1 \
  -numa node,nodeid=0,cpus=0-1,memdev=m0,initiator=0 \
  -numa node,nodeid=1,memdev=m1,initiator=0 \
  -numa dist,src=0,dst=1,val=20 \
  -numa hmat-lb,initiator=0,target=0,hierarchy=memory,data-type=access-latency,latency=80 \
  -numa hmat-lb,initiator=0,target=0,hierarchy=memory,data-type=access-bandwidth,bandwidth=100G \
  -numa hmat-lb,initiator=0,target=1,hierarchy=memory,data-type=access-latency,latency=250 \
  -numa hmat-lb,initiator=0,target=1,hierarchy=memory,data-type=access-bandwidth,bandwidth=30G \
  -kernel "$KERNEL" -initrd "$WORK/initrd.gz" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1" \
  -nographic -no-reboot -serial mon:stdio </dev/null | tr -d '\r' >"$LOG" || true
grep -q '^@@DONE' "$LOG" || { echo "run.sh: the guest did not finish; log: $LOG" >&2; tail -30 "$LOG" >&2; exit 1; }
echo "$LOG"
