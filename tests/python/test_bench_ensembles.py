"""The ensemble benchmarks, briefly (their recorded runs: docs/benchmarks.md, "Staged
inputs" and "Ensembles under Slurm"): each runs end to end, verifies every instance and
prints its table.

Needs root (network namespaces, cgroups, slurmd) and the staged build."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_cluster import available

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_staging_bench_verifies_every_instance():
    p = subprocess.run([sys.executable, str(ROOT / "bench/staging.py"), "--reps", "1", "--counts", "4",
                        "--mib", "2"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [line for line in p.stdout.splitlines() if line.startswith("| 4 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["fetch", "staged", "local"], p.stdout


@pytest.mark.skipif(available() is not None, reason=available() or "")
def test_ensemble_bench_on_two_emulated_nodes():
    p = subprocess.run([sys.executable, str(ROOT / "bench/ensemble.py"), "--nodes", "2", "--per-class", "1",
                        "--quick", "--envs", "IE,IMME", "--share", "0.7,0.5"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    # All four classes verified with all their memory (IE), once; IMME at each share.
    assert p.stdout.count("| 2 | - | IE | 4/4 |") == 1, p.stdout + p.stderr[-2000:]
    assert "| 2 | 0.5 | IMME |" in p.stdout and "| 2 | 0.7 | IMME |" in p.stdout, p.stdout
    # Figure 8: a row per class, a column per share (sorted).
    assert "| nodes | class | env | 0.5 | 0.7 |" in p.stdout, p.stdout
    for n in ("DL", "DM", "DC", "SC"):
        assert f"| 2 | {n} | IMME |" in p.stdout, p.stdout


def test_ensemble_bench_refuses_a_bad_share():
    for bad in ("0", "2", "x", "0.5,0.5", ""):
        p = subprocess.run([sys.executable, str(ROOT / "bench/ensemble.py"), "--share", bad],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "--share" in p.stderr, (bad, p.stderr)
