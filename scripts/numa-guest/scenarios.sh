# Scenarios run inside the NUMA guest. Each prints "@@BEGIN name", its output, and
# "@@END name rc=N"; tests/numa/test_numa_guest.py reads them from the serial log.
step() {
  name=$1; shift
  echo "@@BEGIN $name"
  "$@" 2>&1
  echo "@@END $name rc=$?"
}
export ATTUNE_CONFIG=/etc/attune.toml
A=/bin/attune

step topology $A topology --json
step weights-plan $A numa weights
step lat $A numa place --region 64M:LAT
# LAT for a user who may lock no memory (RLIMIT_MEMLOCK 0, not root): the pinned part
# stays pageable with a warning; placement and data are as above (docs/reliability.md).
step lat-memlock-0 sh -c "ulimit -l 0; exec /usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all $A numa place --region 64M:LAT"
step cap $A numa place --region 64M:CAP
# Without a configuration: the default far tier is the CPU-less node (`far = "auto"`).
step far-auto-topology sh -c "unset ATTUNE_CONFIG; exec $A topology"
step far-auto-cap sh -c "unset ATTUNE_CONFIG; exec $A numa place --region 64M:CAP"
step lat-cap $A numa place --region 128M:LAT,CAP
# BW before the weights are set: the kernel's weights (1 per node) are not the bandwidth
# ratio, so Attune stripes.
step bw-stripes $A numa place --region 130M:BW
step weights-apply $A numa weights --apply
step bw-weighted $A numa place --region 130M:BW
# Algorithm 2 across regions: a LAT region arrives when DRAM is taken by an unflagged one.
step pressure env ATTUNE_DRAM=256M $A numa place --region 200M:NONE --region 128M:LAT
step migrate $A numa place --region 64M:CAP --move 0:0
# Flags changed later (attune_set_flags): CAP data becomes a LAT table and moves up.
step reflag $A numa place --region 64M:CAP --reflag 0:LAT
# A tier index that does not exist: refused before anything is allocated.
step bad-move $A numa place --region 8M:LAT --move 0:5
# A configured node that is not there: left out with a warning, the program still runs.
printf 'dram = "256M"\n[[tier]]\nname = "gone"\nkind = "numa"\nnode = 7\n' >/tmp/gone.toml
step missing-node env ATTUNE_CONFIG=/tmp/gone.toml $A numa place --region 8M:LAT
# Hot-page promotion from write heat (before the kernel's own tiering is switched on):
# 8 MiB of CAP data, placed on node 1, written for 4 s.
step promote $A numa place --region 64M:CAP --write-hot 0:8M --hot-secs 4
# The same with asynchronous write-protection masked, as on kernels before 6.7: write heat
# from soft-dirty bits (docs/design/kernels.md).
step promote-soft-dirty env ATTUNE_LOG=info ATTUNE_KERNEL_FEATURES=-wp_async,-pagemap_scan $A numa place --region 64M:CAP --write-hot 0:8M --hot-secs 4
# The same under a migration limit of 2 MiB/s: the 8 MiB need about 4 s.
step promote-limited env ATTUNE_MOVE_LIMIT=2M $A numa place --region 64M:CAP --write-hot 0:8M --hot-secs 7
# No room on the fast tier: cold cells of the older unflagged region make room.
step promote-swap env ATTUNE_DRAM=64M $A numa place --region 64M:NONE --region 64M:CAP --write-hot 1:8M --hot-secs 10
# Background demotion: allocations fill the 64 MiB budget; 16 MiB of headroom is then
# restored from the unflagged region's cold cells, never from the LAT region's.
step headroom env ATTUNE_DRAM=64M ATTUNE_HEADROOM=16M $A numa place --region 32M:LAT --region 32M:NONE --hot-secs 5
# CAP data moved up (as a promotion would) gives the headroom back before older data does.
step headroom-cap env ATTUNE_DRAM=64M ATTUNE_HEADROOM=8M $A numa place --region 56M:NONE --region 16M:CAP --move 1:0 --hot-secs 5
# Forks while the heat scanner works (here it swaps cells under the placer's lock): every
# child must get a working runtime (NUMA allocation, data, statistics), none may hang.
step forks env ATTUNE_DRAM=64M $A numa place --region 64M:NONE --region 64M:CAP --write-hot 1:8M --hot-secs 6 --forks 40
# Temperature-only mode: flags ignored (placed as unflagged), heat still promotes.
step temperature env ATTUNE_MODE=temperature $A numa place --region 64M:LAT
# Linux's own tiering on the same program: demotion on, NUMA balancing in tiering mode.
echo 1 >/sys/kernel/mm/numa/demotion_enabled
echo 2 >/proc/sys/kernel/numa_balancing
D=/sys/kernel/debug/sched/numa_balancing
[ -d $D ] && { echo 100 >$D/scan_delay_ms; echo 100 >$D/scan_period_min_ms; echo 1000 >$D/scan_period_max_ms; }
# The capacity data comes first, the hot lookup table after it (a later phase).
step kernel-tiering $A numa place --kernel --region 900M:CAP --region 128M:LAT --hot-secs 10
step attune-tiering $A numa place --region 900M:CAP --region 128M:LAT --hot-secs 10
