"""Figure 7 (co-located workflows, DRAM by allocation policy) end to end at small sizes:
every workflow of the mix runs next to the others under each policy, its result is
verified, the daemon-arbitrated policies really went through attuned, and the JSON,
Markdown and plots are produced."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATT = os.path.join(ROOT, "build", "bin", "attune")
FIG7 = os.path.join(ROOT, "bench", "fig7.py")


@pytest.mark.skipif(not os.path.exists(ATT), reason="make build first")
def test_quick_mix(tmp_path):
    kernel = subprocess.run([ATT, "kernel-swap", "--check"], capture_output=True, text=True).returncode == 0
    # kernel and pool run in kernel-swap's cgroup (root).
    pols = "default,uniform,attuned" + (",kernel,pool" if kernel else "")
    r = subprocess.run([sys.executable, FIG7, "--quick", "--reps", "1", "--workloads", "dm,stream,dgemm",
                        "--policies", pols, "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.load(open(tmp_path / "fig7.json"))
    assert res["policies"] == pols.split(",")
    assert [w["name"] for w in res["workflows"]] == ["dm", "stream", "dgemm"]
    assert res["pool_mib"] < res["node_mib"]
    for w in res["workflows"]:
        for p in pols.split(","):
            x = w["policies"][p]
            assert x["ok"], (w["name"], p, x)
            assert x["normalized"] > 0
        # Uniform is the fixed per-workflow budget.
        assert w["policies"]["uniform"]["dram"] == w["managed_budget"]
    # The daemon arbitrated the policies it runs: its grants were sampled for the longest
    # workflow (the quick stream and DGEMM may end between two samples).
    dm = res["workflows"][0]
    assert dm["policies"]["default"]["dram"] is not None
    assert dm["policies"]["attuned"]["dram"] is not None
    if kernel:
        assert dm["policies"]["pool"]["dram"] is not None, "the pool policy ran through attuned"
        # In its cgroup, the limit less every workflow's room (their parts outside Attune).
        assert 0 < res["pool_policy_mib"] < res["node_mib"]
        assert "for the pool policy: its cgroup's limit less their rooms" in (tmp_path / "fig7.md").read_text()
    for p in pols.split(","):
        assert res["totals"][p] > 0
    md = (tmp_path / "fig7.md").read_text()
    assert "| stream triad | BW |" in md and "DRAM each workflow" in md
    for f in ("imme-fig7.png", "imme-fig7.svg"):
        assert (tmp_path / f).stat().st_size > 0, f


def test_rejects_bad_arguments(tmp_path):
    for args, say in ((["--policies", "first-touch"], "unknown policy"),
                      (["--workloads", "dm"], "two or more"),
                      (["--workloads", "dm,nope"], "two or more"),
                      (["--outside", "0"], "--outside"),
                      (["--reps", "0"], "--reps"),
                      (["--bw-dram-share", "0"], "--bw-dram-share"),
                      (["--bw-dram-share", "101"], "--bw-dram-share")):
        r = subprocess.run([sys.executable, FIG7, "--out", str(tmp_path)] + args, capture_output=True, text=True)
        assert r.returncode != 0 and say in r.stderr + r.stdout, (args, r.stderr)
