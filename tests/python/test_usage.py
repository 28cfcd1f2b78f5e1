"""attune usage: golden outputs on a synthetic sacct dump (multi-node MPI, multi-step,
array, heterogeneous, OOM, pending, never-started and malformed lines), hand-computed
figures, node samples with a known pool what-if, a generated dump with known answers,
and bad input."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from attune_usage import cli, jobs, sacct, system, units  # noqa: E402

FIX = os.path.join(ROOT, "tests", "fixtures", "usage")
ATT = os.path.join(ROOT, "build", "bin", "attune")
GiB = 1 << 30
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def run_cli(args, capsys):
    rc = cli.main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def golden(name, got):
    path = os.path.join(FIX, name)
    if UPDATE:
        open(path, "w").write(got)
    assert got == open(path).read(), f"{name} differs (UPDATE_GOLDEN=1 rewrites it after review)"


def by_id(doc):
    return {j["job_id"]: j for j in doc["jobs"]}


def test_golden_json(capsys):
    rc, out, _ = run_cli([os.path.join(FIX, "jobs.sacct"), "--json"], capsys)
    assert rc == 0
    golden("jobs.expected.json", out)


def test_hand_computed_figures(capsys):
    rc, out, _ = run_cli([os.path.join(FIX, "jobs.sacct"), "--json"], capsys)
    d = json.loads(out)
    j = by_id(d)
    # MPI: 8 tasks on 2 nodes, MaxRSS 8G, AveRSS 2G, 128G allocated (64G a node).
    assert j["1002"]["util"] == pytest.approx(2 * 8 / 2 / 64)
    assert j["1002"]["imbalance"] == pytest.approx(4.0)
    assert j["1002"]["util_eq1"] == pytest.approx(8 * 8 / 2 / 64)      # the paper's overestimate
    # Multi-step: the largest step (2 tasks, AveRSS 4G) against 8000M per CPU x 2 CPUs.
    assert j["1003"]["util"] == pytest.approx(8192 / 16000)
    assert j["1003"]["imbalance"] == pytest.approx(1.5)
    # Array tasks and heterogeneous components are jobs of their own; a pending array is not measured.
    assert {"1004_1", "1004_2", "1007+0", "1007+1"} <= set(j)
    assert j["1004_[3-5]"]["util"] is None
    # OOM: the job's state or a step's.
    assert {k for k, v in j.items() if v["oom"]} == {"1004_2", "1005"}
    s = d["summary"]
    assert s["jobs"] == 8 and s["jobs_finished"] == 9         # 1006 never started, 1008 runs, 1004_[3-5] pends
    assert s["oom_per_10k"] == pytest.approx(2 / 9 * 1e4, abs=1e-3)
    assert s["records"]["malformed"] == 4
    assert s["records"]["malformed_by_reason"] == {"MaxRSS not a size": 1, "job id not understood": 1,
                                                   "wrong number of fields": 2}


def test_node_memory_denominator(capsys):
    rc, out, _ = run_cli([os.path.join(FIX, "jobs.sacct"), "--json", "--node-mem", "128G"], capsys)
    j = by_id(json.loads(out))
    assert j["1002"]["util"] == pytest.approx(8 / 128)
    assert j["1002"]["util_alloc"] == pytest.approx(8 / 64)


def test_categories(capsys):
    rc, out, _ = run_cli([os.path.join(FIX, "jobs.sacct"), "--json", "--category-rule", "SIM=^(lmp|serial)",
                          "--category-rule", "ML=multi"], capsys)
    d = json.loads(out)
    cats = {j["job_id"]: j["category"] for j in d["jobs"]}
    assert cats["1002"] == "SIM" and cats["1001"] == "SIM" and cats["1003"] == "ML" and cats["1005"] == "other"
    assert d["summary"]["categories"]["SIM"]["jobs"] == 2
    rc, out, _ = run_cli([os.path.join(FIX, "jobs.sacct"), "--json", "--category-column", "Account"], capsys)
    assert set(json.loads(out)["summary"]["categories"]) >= {"phys", "chem", "ml", "bio"}


def test_samples_eq3_and_pool_what_if(capsys):
    samples, dropped = system.read_samples(os.path.join(FIX, "nodes.csv"))
    assert dropped == 2                            # a bad time, free above total
    over = system.utilization_over_time(samples)
    assert list(over["util"].round(6)) == [0.45, 0.45]
    w = system.pool_what_if(samples, local_share=0.5)
    assert w["sum_of_peaks_bytes"] == 160 * GiB and w["peak_of_sums_bytes"] == 90 * GiB
    assert w["at_local_share"]["pool_bytes"] == 30 * GiB
    assert w["at_local_share"]["saved_bytes"] == 70 * GiB
    assert w["sweep"][0]["total_bytes"] == 90 * GiB     # all from the pool: the peak of the sum


def test_cli_golden_text_and_files(tmp_path):
    if not os.path.exists(ATT):
        pytest.skip("make build first")
    r = subprocess.run([ATT, "usage", os.path.join(FIX, "jobs.sacct"), "--samples", os.path.join(FIX, "nodes.csv"),
                        "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    golden("cli.expected.txt", r.stdout)
    assert "4 malformed lines skipped" in r.stderr
    for f in ("report.json", "jobs.csv", "summary.txt", "utilization.png", "imbalance.png", "system.png",
              "pool_what_if.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    assert open(tmp_path / "report.json").read().startswith("{")
    assert len(pd.read_csv(tmp_path / "jobs.csv")) == 12


def test_generated_dump_known_answers():
    from usage_synth import generate
    text, expected = generate(3000, seed=7)
    rec = sacct.parse(text)
    assert not rec.malformed
    got = jobs.analyze(rec).set_index("job_id")
    exp = pd.DataFrame(expected).T
    assert set(got.index) == set(exp.index)
    g = got.loc[exp.index]
    assert (g["util"] - exp["util"].astype(float)).abs().max() < 1e-6
    assert (g["imbalance"] - exp["imbalance"].astype(float)).abs().max() < 1e-3
    assert (g["oom"].astype(bool) == exp["oom"].astype(bool)).all()


def test_parsable_with_trailing_bar_and_any_column_order():
    text = ("jobid|maxrss|state|nnodes|ntasks|reqmem|\n"
            "5||COMPLETED|1||2Gn|\n"
            "5.0|1G|COMPLETED|1|1||\n")
    rec = sacct.parse(text)
    j = jobs.analyze(rec).set_index("job_id")
    assert j.loc["5", "util"] == pytest.approx(0.5)
    assert j.loc["5", "imbalance"] == 1.0          # no AveRSS column: taken as balanced


def test_units():
    v, bad, per = units.parse_size(pd.Series(["2048K", "1.5G", "4000Mn", "100Mc", "", "x", "12", "1GiB"]), "K")
    assert list(v[:4]) == [2 << 20, 1.5 * GiB, 4000 << 20, 100 << 20]
    assert list(per[:4]) == ["", "", "n", "c"]
    assert list(bad) == [False, False, False, False, False, True, False, False]
    assert v[6] == 12 * 1024 and v[7] == GiB
    assert units.parse_size_text("256G") == 256 * GiB
    with pytest.raises(ValueError):
        units.parse_size_text("lots")


@pytest.mark.parametrize("args,msg", [
    (["--node-mem", "lots"], "--node-mem"),
    (["--local-share", "2"], "between 0 and 1"),
    (["--category-rule", "SIM"], "LABEL=REGEX"),
    (["--category-rule", "SIM=("], "bad regular expression"),
    (["--category-column", "Nope"], "no such column"),
    (["--samples", "/nonexistent.csv"], "cannot read node samples"),
])
def test_bad_arguments(capsys, args, msg):
    rc, _, err = run_cli([os.path.join(FIX, "jobs.sacct")] + args, capsys)
    assert rc == 2 and msg in err


def test_bad_inputs(capsys, tmp_path):
    rc, _, err = run_cli(["/nonexistent.sacct"], capsys)
    assert rc == 2 and "cannot read" in err
    empty = tmp_path / "empty"
    empty.write_text("\n\n")
    rc, _, err = run_cli([str(empty)], capsys)
    assert rc == 2 and "empty" in err
    nohdr = tmp_path / "nohdr"
    nohdr.write_text("JobID|State\n1|COMPLETED\n")
    rc, _, err = run_cli([str(nohdr)], capsys)
    assert rc == 2 and "MaxRSS" in err
    only_bad = tmp_path / "bad"
    only_bad.write_text("JobID|State|MaxRSS\ngarbage\nx|y|z\n")
    rc, out, err = run_cli([str(only_bad)], capsys)
    assert rc == 0 and "2 malformed" in out
    badsamples = tmp_path / "s.csv"
    badsamples.write_text("when,host\n1,2\n")
    rc, _, err = run_cli([os.path.join(FIX, "jobs.sacct"), "--samples", str(badsamples)], capsys)
    assert rc == 2 and "no column" in err


def test_stdin_and_unwritable_out(tmp_path):
    if not os.path.exists(ATT):
        pytest.skip("make build first")
    data = open(os.path.join(FIX, "jobs.sacct")).read()
    r = subprocess.run([ATT, "usage", "-", "--json"], input=data, capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["summary"]["jobs"] == 8
    r = subprocess.run([ATT, "usage", os.path.join(FIX, "jobs.sacct"), "--out", "/proc/no-such-dir"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "cannot write to /proc/no-such-dir" in r.stderr


def test_wrapper_without_python(tmp_path):
    if not os.path.exists(ATT):
        pytest.skip("make build first")
    r = subprocess.run([ATT, "usage", "x"], capture_output=True, text=True,
                       env={**os.environ, "ATTUNE_PYTHON": "/nonexistent/python3"})
    assert r.returncode == 127 and "cannot run /nonexistent/python3" in r.stderr
