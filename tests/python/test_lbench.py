"""attune lbench on this machine's memory: the probe slows down as the configured level
rises, the interference coefficient tells a memory-bound neighbour from an idle one, and
bad input fails clearly. Ratios within one run, levels interleaved in rounds (noise)."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATT = os.path.join(ROOT, "build", "bin", "attune")
pytestmark = pytest.mark.skipif(not os.path.exists(ATT), reason="make build first")


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
    # (2026-11-23, a noisy shared host: busy 1.09-1.35, idle 0.68-1.09 before the idle
    # time was taken on both sides of the program.)
    assert b["ic"] > i["ic"] + 0.05
    assert 0.7 < i["ic"] < 1.3


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
