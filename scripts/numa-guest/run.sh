#!/usr/bin/env bash
# Boots the two-node NUMA guest (node 1 CPU-less, lower memory tier by HMAT) under QEMU
# TCG with Attune inside, runs scenarios.sh, and writes the serial log to $1 (default
# target/numa-guest.log). Needs root the first time (fetch.sh installs QEMU 10).
# Recipe and pitfalls: ../shared/notes/numa-vm.md.
#
# GUEST_KERNEL=6.1|5.10 boots an older Debian kernel instead (fetch.sh fetches it),
# GUEST_SCENARIOS names the script run inside (default scenarios.sh), and GUEST_EXTRA a
# directory copied to /opt/attune in the guest with the shared libraries of every program
# in it (the compatibility run's test programs, libattune and the interposer).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
LOG=${1:-$ROOT/target/numa-guest.log}
ATTUNE=${ATTUNE_BIN:-$ROOT/target/release/attune}
KERNEL=$("$HERE/fetch.sh" ${GUEST_KERNEL:-} | tail -1)
SCENARIOS=${GUEST_SCENARIOS:-$HERE/scenarios.sh}
[ -x "$ATTUNE" ] || { echo "run.sh: $ATTUNE not built (cargo build --release)" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
R=$WORK/root
mkdir -p "$R"/{bin,sbin,etc,proc,sys,dev,tmp,lib64,usr/bin}
cp "$(command -v busybox)" "$R/bin/busybox"
cp "$ATTUNE" "$R/bin/attune"
ELFS=("$ATTUNE")
# util-linux's setpriv: scenarios run as a user who is not root (busybox's has no --reuid).
cp "$(command -v setpriv)" "$R/usr/bin/setpriv"
ELFS+=("$(command -v setpriv)")
if [ -n "${GUEST_EXTRA:-}" ]; then
  mkdir -p "$R/opt/attune"
  cp -a "$GUEST_EXTRA"/. "$R/opt/attune/"
  while IFS= read -r f; do ELFS+=("$f"); done < <(find "$GUEST_EXTRA" -type f -perm -u+x -o -type f -name '*.so')
fi
# Shared libraries of the programs, at the paths the loader looks for them.
for elf in "${ELFS[@]}"; do
  for lib in $(LD_LIBRARY_PATH="${GUEST_EXTRA:+$GUEST_EXTRA/lib}" ldd "$elf" 2>/dev/null | grep -o '/[^ ]*'); do
    case "$lib" in "${GUEST_EXTRA:-/nonexistent}"/*) continue;; esac
    [ -e "$R$lib" ] && continue
    mkdir -p "$R$(dirname "$lib")"
    cp -L "$lib" "$R$lib"
  done
done
cp "$HERE/init" "$R/init"
chmod +x "$R/init"
cp "$SCENARIOS" "$R/scenarios.sh"
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
