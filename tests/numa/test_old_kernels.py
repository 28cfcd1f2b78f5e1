"""Attune on real older kernels: Debian bookworm's 6.1 and bullseye's 5.10 booted in the
two-node QEMU guest (scripts/numa-guest/run.sh with GUEST_KERNEL, GUEST_SCENARIOS=compat.sh).

Neither kernel has UFFDIO_MOVE (6.8) or UFFDIO_POISON (6.6), so the fallbacks of
docs/design/kernels.md run for real there: eviction by write-protect + copy + drop, SIGBUS
sent for a lost page. Checked inside the guest: checksummed integrity on the memory and
file tiers in both deliveries, 8 threads under signal delivery, a fork, a lost tier,
`attune run` of an unmodified program under a budget (its answer and its report), and
NUMA placement per flag. Set OLD_KERNEL_LOG_<V> (V = 6_1, 5_10) to check a log without
booting.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
MiB = 1 << 20
PROGRAMS = ["integrity", "stress", "fork_inherit", "lost_tier"]


def guest_extra(tmp):
    """The programs and libraries the guest runs, in the layout of an installed prefix."""
    extra = Path(tmp) / "extra"
    (extra / "bin").mkdir(parents=True)
    (extra / "lib").mkdir()
    for lib in BUILD.glob("lib/*.so"):
        shutil.copy(lib, extra / "lib")
    shutil.copy(BUILD / "bin" / "attune", extra / "bin")
    cflags = subprocess.run(["pkg-config", "--cflags", "--libs", "attune"], capture_output=True,
                            text=True, check=True,
                            env={**os.environ, "PKG_CONFIG_PATH": str(BUILD / "lib/pkgconfig")}).stdout.split()
    for p in PROGRAMS:
        subprocess.run(["gcc", "-O2", f"-I{ROOT}/tests/c", str(ROOT / f"tests/c/{p}.c"), "-o",
                        str(extra / "bin" / p), *cflags, "-lpthread"], check=True)
    subprocess.run(["gcc", "-O2", str(ROOT / "tests/run/rand_update.c"), "-o",
                    str(extra / "bin/rand_update")], check=True)
    return extra


def boot(version):
    env_log = os.environ.get("OLD_KERNEL_LOG_" + version.replace(".", "_"))
    if env_log:
        return Path(env_log).read_text(errors="replace")
    with tempfile.TemporaryDirectory() as tmp:
        extra = guest_extra(tmp)
        log = ROOT / "target" / f"old-kernel-{version}.log"
        env = {**os.environ, "GUEST_KERNEL": version, "GUEST_EXTRA": str(extra),
               "GUEST_SCENARIOS": str(ROOT / "scripts/numa-guest/compat.sh"),
               "ATTUNE_BIN": str(BUILD / "bin" / "attune")}
        r = subprocess.run([str(ROOT / "scripts/numa-guest/run.sh"), str(log)], env=env,
                           capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, f"guest run failed:\n{r.stdout}\n{r.stderr}"
        return log.read_text(errors="replace")


@pytest.fixture(scope="module", params=["6.1", "5.10"])
def guest(request):
    text = boot(request.param)
    assert "@@DONE" in text, text[-3000:]
    m = re.search(r"^@@GUEST kernel=(\S+)", text, re.M)
    assert m and m.group(1).startswith(request.param + "."), m and m.group(1)
    steps = {}
    for s in re.finditer(r"^@@BEGIN (\S+)\n(.*?)^@@END \1 rc=(\d+)$", text, re.S | re.M):
        steps[s.group(1)] = (s.group(2), int(s.group(3)))
    return request.param, steps


def ok(guest, name):
    out, rc = guest[1][name]
    assert rc == 0, f"{guest[0]}: {name} failed (rc={rc}):\n{out}"
    return out


def test_doctor_names_the_fallbacks(guest):
    out = ok(guest, "doctor")
    d = json.loads(out[out.index("{"):])
    assert d["fault_engine"] and d["write_protect"], d
    states = {f["feature"]: f["state"] for f in d["features"]}
    # Neither kernel has UFFDIO_MOVE or UFFDIO_POISON; neither has async write-protect.
    for f in ("move", "poison", "wp_async", "pagemap_scan", "weighted_interleave"):
        assert states[f] == "absent", (guest[0], f, states)
    # Debian's kernels keep soft-dirty bits: NUMA write heat comes from them.
    assert states["soft_dirty"] == "used", (guest[0], states)


@pytest.mark.parametrize("step", ["integrity-memory-thread", "integrity-memory-signal",
                                  "integrity-file", "stress-signal", "fork-inherit",
                                  "lost-tier"])
def test_checksummed_programs_pass(guest, step):
    out = ok(guest, step)
    assert "FAIL" not in out, out


def test_integrity_really_tiered(guest):
    # "integrity: 12 MiB, chunk 4096, faults N, evictions M, ..." with pages moved.
    for step in ("integrity-memory-thread", "integrity-memory-signal", "integrity-file"):
        out = ok(guest, step)
        m = re.search(r"faults (\d+), evictions (\d+)", out)
        assert m and int(m.group(1)) > 1000 and int(m.group(2)) > 1000, (step, out)


def test_an_unmodified_program_runs_under_a_budget(guest):
    out = ok(guest, "run-unmodified")
    assert "rand_update: OK" in out, out
    rep = json.loads(ok(guest, "run-report"))
    proc = rep["per_process"][0]
    assert proc["kernel_fallbacks"][:2] == ["move", "poison"], proc["kernel_fallbacks"]
    assert rep["totals"]["evictions"] > 0 and proc["peak_resident_bytes"] <= 8 * MiB + 2 * MiB, rep["totals"]


def pages(region, node):
    return region["pages_per_node"].get(str(node), 0)


def report(guest, name):
    out = ok(guest, name)
    return json.loads([l for l in out.splitlines() if l.startswith("{")][-1])


def test_numa_placement_per_flag(guest):
    lat = report(guest, "lat")["regions"][0]
    assert lat["checksum_ok"] and pages(lat, 0) == 64 * MiB // 4096 and pages(lat, 1) == 0, lat
    cap = report(guest, "cap")["regions"][0]
    assert cap["checksum_ok"] and pages(cap, 1) == 64 * MiB // 4096 and pages(cap, 0) == 0, cap
    bw = report(guest, "bw")["regions"][0]
    # No weighted interleave before 6.9: stripes in the bandwidth ratio (HMAT 100G : 30G).
    assert bw["checksum_ok"] and bw["ranges"][0]["how"] == "stripes", bw
    share = pages(bw, 0) / (pages(bw, 0) + pages(bw, 1))
    want = 102400 / (102400 + 30720)
    assert abs(share - want) / want < 0.05, (share, want)


def test_written_hot_data_is_promoted_by_soft_dirty_bits(guest):
    """No asynchronous write-protection before 6.7: the heat scanner reads soft-dirty
    bits, and 8 MiB of CAP data written for 4 s move from node 1 to node 0."""
    out = ok(guest, "promote")
    assert "NUMA write heat from soft-dirty bits" in out, out
    rep = report(guest, "promote")
    h = rep["regions"][0]["written_hot"]
    assert rep["regions"][0]["checksum_ok"]
    assert h["pages_per_node"] == {"0": 2048}, (guest[0], h)
    assert h["rest_pages_per_node"] == {"1": 14336}, (guest[0], h)
