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
                        "--quick", "--envs", "IE,IMME"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    # All four classes verified with all their memory (IE).
    assert "| 2 | IE | 4/4 |" in p.stdout, p.stdout + p.stderr[-2000:]
    assert "| 2 | IMME |" in p.stdout, p.stdout
