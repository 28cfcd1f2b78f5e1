"""The runtime's own page-movement limit (`move_limit`, ATTUNE_MOVE_LIMIT): a program
thrashing a 16 MiB budget moves at most the limit (fetches and evictions together), and
several times more without it, so the check can fail."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATT = os.path.join(ROOT, "build", "bin", "attune")
pytestmark = pytest.mark.skipif(not os.path.exists(ATT), reason="make build first")
MIB = 1 << 20


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    exe = tmp_path_factory.mktemp("bin") / "skewed"
    subprocess.run(["gcc", "-O2", os.path.join(ROOT, "tests", "run", "skewed.c"), "-o", str(exe)], check=True)
    return str(exe)


def moved_per_s(skewed, tmp_path, **env):
    rep = tmp_path / "r.json"
    e = dict(os.environ, ATTUNE_HISTORY="off", **env)
    # Uniform access over 64 MiB: every touch outside the budget is a fault.
    r = subprocess.run([ATT, "run", "-q", "--dram", "16M", "--report", str(rep), "--", skewed, "64", "2", "50", "50"],
                       capture_output=True, text=True, timeout=120, env=e)
    assert r.returncode == 0 and "skewed: OK" in r.stdout, r.stderr
    t = json.loads(rep.read_text())
    return t["totals"]["moved_bytes"] / t["wall_seconds"]


def test_move_limit_holds_and_can_fail(skewed, tmp_path):
    free = moved_per_s(skewed, tmp_path)
    limited = moved_per_s(skewed, tmp_path, ATTUNE_MOVE_LIMIT="40M")
    # The limit plus the 20 ms burst, over a run of about 2 s (start-up included).
    assert limited <= 40 * MIB * 1.15, f"{limited / MIB:.0f} MiB/s under a 40 MiB/s limit"
    assert free > 3 * 40 * MIB, f"unlimited only {free / MIB:.0f} MiB/s: the check could not fail"


def test_bad_move_limit_is_refused(skewed):
    r = subprocess.run([ATT, "run", "--dram", "16M", "--", skewed, "1", "0"], capture_output=True, text=True,
                       env=dict(os.environ, ATTUNE_MOVE_LIMIT="fast"))
    assert r.returncode == 2 and "move_limit" in r.stderr, r.stderr
