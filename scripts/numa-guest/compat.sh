# Scenarios of the compatibility run on an older kernel (GUEST_KERNEL=6.1 or 5.10:
# docs/design/kernels.md). Each prints "@@BEGIN name", its output, and "@@END name rc=N";
# tests/numa/test_old_kernels.py reads them. The programs and libraries come from
# GUEST_EXTRA (/opt/attune here); sizes are small because TCG is slow.
step() {
  name=$1; shift
  echo "@@AT $name $(cut -d' ' -f1 /proc/uptime)"   # seconds since boot (where the time goes)
  echo "@@BEGIN $name"
  "$@" 2>&1
  echo "@@END $name rc=$?"
}
O=/opt/attune
A=$O/bin/attune
export LD_LIBRARY_PATH=$O/lib ATTUNE_HISTORY=off
B=$((8 << 20))
# Integrity at 3x a 4 MiB budget with 40000 random reads: 200000 (the program's default)
# faulted 136 k times at about 0.3 ms each under TCG, 38 s under thread delivery on 5.10,
# most of a boot's 145 s.
S=$((4 << 20))
export INTEGRITY_READS=40000
step doctor $A doctor --json
# The fault engine's steps without a file name the in-process memory tier (M): the default
# far tier here would be the CPU-less node 1 (`far = "auto"`), which the NUMA steps test.
M=ATTUNE_FAR=memory,file
# Checksummed integrity on the memory tier (both deliveries), the file tier, a fork.
step integrity-memory-thread env $M ATTUNE_DRAM=4M TEST_BUDGET=$S $O/bin/integrity 12
step integrity-memory-signal env $M ATTUNE_FAULT_MODE=signal ATTUNE_DRAM=4M TEST_BUDGET=$S $O/bin/integrity 12
printf 'dram = "8M"\n[[tier]]\nname = "ssd"\nkind = "file"\npath = "/tmp"\ncapacity = "256M"\nmin_chunk = "4K"\n' >/tmp/file.toml
step integrity-file env ATTUNE_CONFIG=/tmp/file.toml ATTUNE_DRAM=4M TEST_BUDGET=$S $O/bin/integrity 12
step stress-signal env $M ATTUNE_FAULT_MODE=signal ATTUNE_DRAM=8M TEST_BUDGET=$B STRESS_THREADS=8 STRESS_ITERS=3000 $O/bin/stress 16
step fork-inherit env $M ATTUNE_DRAM=8M TEST_BUDGET=$B $O/bin/fork_inherit
# A page whose only copy is lost: SIGBUS, without UFFDIO_POISON under thread delivery.
step lost-tier env ATTUNE_CONFIG=/tmp/file.toml TIER_DIR=/tmp TEST_BUDGET=$B $O/bin/lost_tier
# An unmodified program under a budget, with the run report.
step run-unmodified env $M $A run --dram 8M --report /tmp/run.json -- $O/bin/rand_update 24 100000
step run-report sh -c 'cat /tmp/run.json; echo'
# NUMA placement per flag (node 1 CPU-less; on 6.1 and 5.10 both nodes are one memory
# tier for the kernel: Attune orders them by HMAT latency and distance).
export ATTUNE_CONFIG=/etc/attune.toml
step topology $A topology --json
step lat $A numa place --region 64M:LAT
step cap $A numa place --region 64M:CAP
step bw $A numa place --region 130M:BW
# Write heat without asynchronous write-protection: soft-dirty bits.
step promote env ATTUNE_LOG=info $A numa place --region 64M:CAP --write-hot 0:8M --hot-secs 4
