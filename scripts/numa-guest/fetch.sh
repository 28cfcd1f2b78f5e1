#!/usr/bin/env bash
# Fetches what the two-node NUMA guest needs, without touching /etc/apt:
#   - QEMU 10 (qemu-system-x86, installed system-wide: it has many shared-library
#     dependencies) and busybox-static, numactl;
#   - a Debian 6.12 kernel (only vmlinuz, extracted into the cache).
# Both come from bookworm-backports through a private sources list (see
# ../shared/notes/numa-vm.md: 6.1 has no memory tiers, QEMU 7.2 double-faults under TCG).
# Needs root for the install. Idempotent: prints the kernel path and exits when done.
#
# `fetch.sh 6.1` or `fetch.sh 5.10` also fetches an older kernel for the compatibility run
# (docs/design/kernels.md): bookworm's 6.1 and bullseye's 5.10 cloud kernels, from their
# own private sources list (bullseye's packages must not mix into the QEMU install).
set -euo pipefail
CACHE=${ATTUNE_GUEST_CACHE:-/var/cache/attune-guest}
OLD=${1:-}
if [ -n "$OLD" ]; then
  case "$OLD" in 6.1|5.10) ;; *) echo "fetch.sh: kernel '$OLD' is not offered (6.1 or 5.10)" >&2; exit 2;; esac
  # QEMU and busybox first (the default fetch), quietly.
  "$0" >/dev/null
  K=$(ls "$CACHE/kernel-$OLD"/boot/vmlinuz-"$OLD".* 2>/dev/null | head -1 || true)
  if [ -z "$K" ]; then
    [ "$(id -u)" = 0 ] || { echo "fetch.sh: fetching a kernel the first time needs root" >&2; exit 1; }
    O="$CACHE/old/apt"
    mkdir -p "$O/lists/partial" "$O/cache/archives/partial" "$CACHE/kernel-$OLD"
    printf 'deb http://deb.debian.org/debian bookworm main\ndeb http://deb.debian.org/debian bullseye main\n' >"$O/sources.list"
    OD=(-o "Dir::Etc::SourceList=$O/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$O/lists" -o "Dir::Cache=$O/cache")
    apt-get "${OD[@]}" -q update >&2
    PKG=$(apt-cache "${OD[@]}" search --names-only "linux-image-${OLD//./\\.}[.-]" 2>/dev/null |
          awk '{print $1}' | grep -E -- '-cloud-amd64(-unsigned)?$' | sort -V | tail -1)
    [ -n "$PKG" ] || { echo "fetch.sh: no $OLD cloud kernel in bookworm or bullseye" >&2; exit 1; }
    (cd "$CACHE/kernel-$OLD" && apt-get "${OD[@]}" -q -y download "$PKG" >&2 &&
       dpkg-deb -x "$PKG"_*.deb . && rm -rf "$PKG"_*.deb lib usr)
    K=$(ls "$CACHE/kernel-$OLD"/boot/vmlinuz-* | head -1)
  fi
  echo "$K"
  exit 0
fi
mkdir -p "$CACHE/apt/lists/partial" "$CACHE/apt/cache/archives/partial" "$CACHE/kernel"
SRC="$CACHE/apt/sources.list"
if [ ! -s "$SRC" ]; then
  {
    echo "deb http://deb.debian.org/debian bookworm main"
    echo "deb http://deb.debian.org/debian bookworm-backports main"
  } >"$SRC"
fi
# Our own sources, lists and cache (apt-cache takes these; apt-get also -q -y).
DIRS=(-o "Dir::Etc::SourceList=$SRC" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$CACHE/apt/lists" -o "Dir::Cache=$CACHE/apt/cache")
APT=("${DIRS[@]}" -q -y)
have_qemu() {
  command -v qemu-system-x86_64 >/dev/null &&
    qemu-system-x86_64 --version | grep -Eq 'version (9|[1-9][0-9])\.'
}
KERNEL=$(ls "$CACHE"/kernel/boot/vmlinuz-6.1[2-9]* 2>/dev/null | head -1 || true)
if have_qemu && [ -n "$KERNEL" ] && command -v busybox >/dev/null && command -v numactl >/dev/null; then
  echo "$KERNEL"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "fetch.sh: installing QEMU needs root" >&2; exit 1; }
apt-get "${APT[@]}" update >&2
DEBIAN_FRONTEND=noninteractive apt-get "${APT[@]}" install --no-install-recommends \
  -t bookworm-backports qemu-system-x86 >&2
DEBIAN_FRONTEND=noninteractive apt-get "${APT[@]}" install --no-install-recommends \
  busybox-static numactl cpio >&2
if [ -z "$KERNEL" ]; then
  PKG=$(apt-cache "${DIRS[@]}" search --names-only 'linux-image-6\.1[2-9]' 2>/dev/null |
        awk '{print $1}' | grep -E -- '-cloud-amd64(-unsigned)?$' | sort -V | tail -1)
  [ -n "$PKG" ] || { echo "fetch.sh: no 6.12+ cloud kernel in bookworm-backports" >&2; exit 1; }
  (cd "$CACHE/kernel" && apt-get "${APT[@]}" download "$PKG" >&2 &&
     dpkg-deb -x "$PKG"_*.deb . && rm -rf "$PKG"_*.deb lib usr)
  KERNEL=$(ls "$CACHE"/kernel/boot/vmlinuz-* | head -1)
fi
have_qemu || { echo "fetch.sh: QEMU 9 or newer was not installed" >&2; exit 1; }
echo "$KERNEL"
