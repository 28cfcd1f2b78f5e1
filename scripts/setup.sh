#!/usr/bin/env bash
# Installs what the build and the tests need on a fresh Debian machine (idempotent).
set -euo pipefail
need=()
command -v gfortran >/dev/null || need+=(gfortran)
command -v cmake >/dev/null || need+=(cmake)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v g++ >/dev/null || need+=(g++)
# attune run's tests: an MPI program under Open MPI's mpirun.
command -v mpicc >/dev/null || need+=(openmpi-bin libopenmpi-dev)
# attune run's tests of programs linked with their own allocator.
[ -e /usr/include/jemalloc/jemalloc.h ] || need+=(libjemalloc-dev)
[ -e /usr/include/gperftools/tcmalloc.h ] || need+=(libgoogle-perftools-dev)
[ -e /usr/include/mimalloc.h ] || need+=(libmimalloc-dev)
# attune run's tests of the JVM: its own heap, and a JNI library's I/O on heap arrays.
command -v javac >/dev/null || need+=(openjdk-17-jdk-headless)
# attune run's automatic fault delivery: programs that read through io_uring and Linux AIO.
[ -e /usr/include/liburing.h ] || need+=(liburing-dev)
[ -e /usr/include/libaio.h ] || need+=(libaio-dev)
# The remote tier: libfabric's headers for the build (the library itself is opened at
# run time, only by a process with a remote tier), and ip(8) for the test hosts.
[ -e /usr/include/rdma/fabric.h ] || need+=(libfabric-dev)
# fi_info and fi_pingpong: the transport's own figures beside the tier's (bench/remote.py).
command -v fi_pingpong >/dev/null || need+=(libfabric-bin)
command -v ip >/dev/null || need+=(iproute2)
# The Slurm plugin (spank.h) and its tests against a real single-node Slurm; bubblewrap
# and Charliecloud for the container tests (docs/slurm.md).
[ -e /usr/include/slurm/spank.h ] || need+=(libslurm-dev)
command -v slurmctld >/dev/null || need+=(slurmctld)
command -v slurmd >/dev/null || need+=(slurmd)
command -v srun >/dev/null || need+=(slurm-client)
command -v munged >/dev/null || need+=(munge)
# Job accounting in the Slurm tests (sacct shows the jobs' summaries): slurmdbd on a
# private MariaDB that the tests start and stop (tests/python/slurm_cluster.py).
command -v slurmdbd >/dev/null || need+=(slurmdbd)
command -v mariadbd >/dev/null || need+=(mariadb-server)
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v ch-run >/dev/null || need+=(charliecloud-runtime)
# A SquashFS image staged once per node and run by Charliecloud (tests/python/test_stage.py,
# bench/staging.py --image): mksquashfs builds it, busybox (static) is its whole userland.
command -v mksquashfs >/dev/null || need+=(squashfs-tools)
command -v busybox >/dev/null || need+=(busybox-static)
# The failing-tier test: an ext4 file system on a loop device (docs/reliability.md).
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
# The file tier on a disk that fails its reads: a FUSE file system of the tests'
# (tests/c/eio_fs.c; this machine's kernel has no device-mapper or block fault injection).
[ -e /usr/include/fuse3/fuse.h ] || need+=(libfuse3-dev)
# Fibers of Boost.Context (tests/run/fiber_stacks.cpp): stacks switched by a library's own
# assembly, found by the library's name (docs/design/run.md).
[ -e /usr/include/boost/context/fiber.hpp ] || need+=(libboost-context-dev)
command -v fusermount3 >/dev/null || need+=(fuse3)
# The unprivileged numpy test runs the system's Python as nobody (a per-user Python under
# /root cannot be read by another user).
[ -x /usr/bin/python3 ] && ! /usr/bin/python3 -c 'import numpy' 2>/dev/null && need+=(python3-numpy)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: please install: ${need[*]} (needs root: apt-get install ${need[*]})" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# attune run's numpy test, the workflows and plots of bench/imme.py (bench/requirements.txt).
if ! python3 -c 'import numpy, pandas, sklearn, zstandard, igraph, matplotlib, tqdm, pytest, pyarrow, hypothesis' 2>/dev/null; then
  echo "setup: installing bench/requirements.txt (pip)"
  python3 -m pip install -q -r "$(dirname "$0")/../bench/requirements.txt" >/dev/null 2>&1 \
    || echo "setup: warning: could not install bench/requirements.txt; the Python workflows will fail" >&2
fi
command -v cargo >/dev/null || { echo "setup: cargo (Rust) is required: https://rustup.rs" >&2; exit 1; }
# The NUMA guest of the placement tests: QEMU 10 and a 6.12 kernel (bookworm-backports,
# through a private apt sources list; /etc/apt is not touched), and the 6.1 and 5.10
# kernels of the compatibility run (tests/numa/test_old_kernels.py).
if [ "$(id -u)" = 0 ]; then
  for k in "" 6.1 5.10; do
    "$(dirname "$0")/numa-guest/fetch.sh" $k >/dev/null || echo "setup: warning: the NUMA guest (kernel ${k:-6.12}) could not be fetched; its tests will fail" >&2
  done
fi
