"""attune lbench on this machine's memory: the probe slows down as the configured level
rises, the interference coefficient tells a memory-bound neighbour from an idle one, and
bad input fails clearly. Ratios within one run, levels interleaved in rounds (noise)."""
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
_HOST = {}


def host_interference():
    """(IC beside a numpy copy loop, IC beside sleep): whether two processes slow each
    other's memory on this host at all, asked of a generator that is not ours (measured
    once per test session). 2026-11-24's host showed none: 1.009 against 0.999."""
    if not _HOST:
        ref = att("coefficient", "--json", "--", sys.executable, "-c", NUMPY_STREAM, "3")
        idle = att("coefficient", "--json", "--", "sleep", "3")
        assert ref.returncode == 0 and idle.returncode == 0, ref.stderr + idle.stderr
        _HOST["ref"] = json.loads(ref.stdout.strip().splitlines()[-1])["ic"]
        _HOST["idle"] = json.loads(idle.stdout)["ic"]
        print("IC beside a numpy copy loop", _HOST["ref"], "idle", _HOST["idle"])
    return _HOST["ref"], _HOST["idle"]


def skip_without_interference():
    ref, idle = host_interference()
    if ref <= idle + 0.05:
        pytest.skip(f"this host shows no memory interference between two processes "
                    f"(IC beside a numpy copy loop {ref:.3f}, idle {idle:.3f})")


def att(*args, timeout=300):
    return subprocess.run([ATT, "lbench", *args], capture_output=True, text=True, timeout=timeout)


def test_slowdown_rises_with_level():
    r = att("sweep", "--reps", "9", "--levels", "0,20,50,100", "--json")
    assert r.returncode == 0, r.stderr
    rows = {x["level"]: x for x in json.loads(r.stdout)["rows"]}
    perf = {k: v["relative_performance"] for k, v in rows.items()}
    gen = {k: v["generated_level"] for k, v in rows.items()}
    print("relative performance", perf, "generated", gen)
    assert gen[0] == 0 and gen[20] < gen[50] < gen[100]
    assert perf[0] == 1.0
    assert perf[50] < 0.97, perf           # measured 0.76-0.84 here
    # (0.88 against 0.93 on 2026-11-23: a 2-core machine shares its memory bandwidth
    # with whatever else runs, so the margin is small.)
    if perf[100] >= perf[20] - 0.02:
        # Flat in the level (2026-11-24: 0.78 at 20, 50 and 100): the slowdown is not the
        # memory traffic's; say so if the host shows no interference between processes.
        skip_without_interference()
    assert perf[100] < perf[20] - 0.02, perf


def test_calibration_levels_fall_with_flops():
    r = att("calibrate", "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    lv = {p["flops"]: p["level"] for p in c["points"]}
    assert max(lv.values()) == pytest.approx(100.0)
    assert lv[1] > lv[8] > lv[64] > lv[1024]


def test_interference_coefficient():
    busy = att("coefficient", "--json", "--", ATT, "lbench", "run", "--flops", "1", "--duration", "3")
    idle = att("coefficient", "--json", "--", "sleep", "3")
    assert busy.returncode == 0 and idle.returncode == 0, busy.stderr + idle.stderr
    b, i = json.loads(busy.stdout.strip().splitlines()[-1]), json.loads(idle.stdout)
    print("IC busy", b["ic"], "idle", i["ic"])
    assert 0.7 < i["ic"] < 1.3
    # (2026-11-23, a noisy shared host: busy 1.09-1.35, idle 0.68-1.09 before the idle
    # time was taken on both sides of the program. 2026-11-24, another host: busy
    # 1.01-1.03, and a numpy copy loop beside the probe 0.98-1.01: two processes did not
    # slow each other's memory there at all.) Whether this host shows interference
    # between two processes is asked of a generator that is not ours first.
    if b["ic"] <= i["ic"] + 0.05:
        skip_without_interference()
    assert b["ic"] > i["ic"] + 0.05


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
