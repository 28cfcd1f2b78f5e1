"""The evaluation harness end to end at small sizes: every selected workflow runs in every
environment, its result is verified, and the JSON, Markdown and plots are produced."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATT = os.path.join(ROOT, "build", "bin", "attune")


@pytest.mark.skipif(not os.path.exists(ATT), reason="make build first")
def test_quick_suite(tmp_path):
    # CBE needs root and a host whose kernel swap works (`attune kernel-swap --check`).
    cbe = subprocess.run([ATT, "kernel-swap", "--check"], capture_output=True, text=True)
    print(cbe.stdout.strip())
    envs = "IE,TME,IMME" + (",CBE-mem" if cbe.returncode == 0 else "")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "imme.py"), "--quick", "--reps", "1",
                        "--only", "stream,dgemm,sc,dm", "--envs", envs, "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.load(open(tmp_path / "imme.json"))
    assert set(res["workloads"]) == {"stream", "dgemm", "sc", "dm"}
    for w, x in res["workloads"].items():
        assert x["budget"] < x["footprint"], w
        for e in envs.split(","):
            m = x["envs"][e]
            if e.startswith("CBE") and m.get("oom_killed"):
                continue
            assert m["ok"], (w, e, m)
            assert m["result"].startswith("RESULT "), (w, e)
        assert x["envs"]["IE"]["normalized"] == pytest.approx(1.0)
        # Under Attune the data really went through a far tier, wherever its managed
        # peak is above its budget (in a cgroup, DM's small quick size fits: the kernel
        # is charged less than the RSS for the interpreter's library pages).
        if x["managed_peak"] > x["managed_budget"] + (4 << 20) or w in ("stream", "dgemm"):
            assert x["envs"]["TME"]["moved_pages"] > 0, w
        if res["far"] == "pool":
            # In the job's cgroup at the budget, as the kernel: it finished within it, and
            # its DRAM budget is the limit less the room measured for it.
            assert x["managed_budget"] == max(x["budget"] - x["room"], 8 << 20), w
            for e in ("TME", "IMME"):
                assert 0 < x["envs"][e]["cgroup_peak"] <= x["budget"], (w, e, x["envs"][e])
    # Root with cgroup v1 (the CBE check): the fair accounting; else the emulated one, said.
    assert res["far"] == ("pool" if cbe.returncode == 0 else "emulated")
    if res["far"] == "emulated":
        assert "--far emulated" in r.stderr
    for f in ("imme.md", "imme-fig5.png", "imme-fig5.svg", "imme-fig9.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    assert "| stream triad | BW |" in (tmp_path / "imme.md").read_text()


@pytest.mark.skipif(not os.path.exists(ATT), reason="make build first")
def test_the_default_far_tier_in_the_jobs_cgroup(tmp_path):
    # --far file: Attune in a cgroup at the budget with no kernel swap and no daemon, its
    # far tier the one `attune run` picks alone (a file on local scratch, O_DIRECT).
    cbe = subprocess.run([ATT, "kernel-swap", "--check"], capture_output=True, text=True)
    if cbe.returncode != 0:
        pytest.skip(cbe.stdout.strip())
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "imme.py"), "--quick", "--reps", "1",
                        "--only", "stream", "--envs", "IE,TME", "--far", "file", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.load(open(tmp_path / "imme.json"))
    x = res["workloads"]["stream"]
    assert res["far"] == "file" and x["envs"]["TME"]["ok"], x
    assert x["envs"]["TME"]["moved_pages"] > 0
    assert 0 < x["envs"]["TME"]["cgroup_peak"] <= x["budget"]
    md = (tmp_path / "imme.md").read_text()
    assert "`--far file`" in md and "Peak of the job's memory cgroup" in md


@pytest.mark.skipif(not os.path.exists(ATT) or os.geteuid() != 0, reason="make build first; root to become nobody")
def test_a_user_who_is_not_root_gets_the_emulated_accounting_said():
    # No cgroup for a user who is not root: the harness says so and measures the old way,
    # rather than failing or pretending the runs were in the job's limit.
    import pathlib
    import shutil
    import tempfile
    # The system's interpreter: root's own (pyenv under /root) is not nobody's to run; the
    # harness needs only the standard library for a C workload (no plots without matplotlib).
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("no /usr/bin/python3")
    out = pathlib.Path(tempfile.mkdtemp(prefix="attune-imme-nobody-"))   # pytest's is root's alone
    try:
        os.chmod(out, 0o777)
        r = subprocess.run(["runuser", "-u", "nobody", "--", "/usr/bin/python3", os.path.join(ROOT, "bench", "imme.py"),
                            "--quick", "--reps", "1", "--only", "dgemm", "--envs", "IE,TME", "--out", str(out)],
                           capture_output=True, text=True, timeout=600, env=dict(os.environ, HOME="/tmp"))
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert "--far pool: no cgroup for Attune's runs" in r.stderr and "--far emulated" in r.stderr, r.stderr[-2000:]
        res = json.load(open(out / "imme.json"))
        assert res["far"] == "emulated" and res["workloads"]["dgemm"]["envs"]["TME"]["ok"]
        assert "`--far emulated`" in (out / "imme.md").read_text()
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_rejects_bad_arguments(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "imme.py"), "--outside", "1.5",
                        "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode != 0 and "--outside" in (r.stderr + r.stdout)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "imme.py"), "--only", "nope",
                        "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode != 0 and "no workload" in (r.stderr + r.stdout)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "imme.py"), "--far", "ram",
                        "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode != 0 and "--far" in r.stderr and "pool" in r.stderr


@pytest.mark.skipif(not os.path.exists(ATT), reason="make build first")
def test_interrupted_run_keeps_partial_results(tmp_path):
    # SIGTERM once the second workflow has started (the harness runs them in its table's
    # order: stream, then dgemm): the first one's results are written, marked as
    # partial, the run in flight is stopped, and the exit status says so.
    p = subprocess.Popen([sys.executable, "-u", os.path.join(ROOT, "bench", "imme.py"), "--quick", "--reps", "1",
                          "--only", "dgemm,stream", "--envs", "IE,TME", "--out", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = b""
    import select
    import signal
    import time
    deadline = time.time() + 600
    while b"dgemm" not in seen and time.time() < deadline:
        r, _, _ = select.select([p.stderr], [], [], 1.0)
        if r:
            chunk = os.read(p.stderr.fileno(), 4096)
            if not chunk:
                break
            seen += chunk
    assert b"dgemm" in seen, seen[-2000:]
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, (out[-2000:], err[-2000:])
    res = json.load(open(tmp_path / "imme.json"))
    assert res["interrupted"] is True
    assert list(res["workloads"]) == ["stream"]
    assert res["workloads"]["stream"]["envs"]["TME"]["ok"]
    assert "**Interrupted**: partial results, 1 of 2 workflows" in (tmp_path / "imme.md").read_text()
    # The stopped run is gone with its runtime (no dgemm process of this test left).
    left = subprocess.run(["pgrep", "-f", "attune-imme-.*/dgemm"], capture_output=True, text=True).stdout.split()
    assert not left, left


def test_a_missing_environment_is_not_a_failed_workflow():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import imme
    from types import SimpleNamespace
    ru = SimpleNamespace(ru_minflt=0, ru_majflt=0, ru_maxrss=0)
    before = imme.vmstat()
    err = b"attune kernel-swap: swap: not enough free space in /var/tmp for a 4.0 GiB swap file (1.0 GiB free)\n"
    r = imme.finish_run(SimpleNamespace(returncode=2), 0.0, before, b"", err, ru, False)
    assert not r["ok"] and r["setup_failed"].startswith("not enough free space")
    # A workflow that fails under the kernel is a failure, not a missing environment.
    r = imme.finish_run(SimpleNamespace(returncode=1), 0.0, before, b"RESULT x BAD seconds=1\n",
                        b"attune kernel-swap: ./x - exit 1, 1.0 s wall\n", ru, False)
    assert not r["ok"] and r["setup_failed"] is None
    res = {"date": "d", "reps": 1, "outside": 0.25, "workloads": {"x": {
        "title": "X", "flags": "LAT", "footprint": 1 << 30, "budget": 1 << 29,
        "envs": {"CBE-disk": {"ok": False, "setup_failed": "not enough free space", "majflt": 0, "minflt": 0,
                              "moved_pages": 0}}}}}
    md = imme.markdown(res, "cmd")
    assert "n/a (set-up)" in md and "CBE-disk: not enough free space" in md


def test_environments_left_out_are_not_columns_of_failures():
    # --envs IE,TME,IMME: the table has those columns only, and the ratio that can be made.
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import imme
    run = {"ok": True, "cut": False, "median": 2.0, "min": 2.0, "max": 2.0, "normalized": 2.0,
           "majflt": 0, "minflt": 5, "moved_pages": 7}
    res = {"date": "d", "reps": 1, "outside": 0.25, "workloads": {"x": {
        "title": "X", "flags": "LAT", "footprint": 1 << 30, "budget": 1 << 29,
        "envs": {"IE": dict(run, median=1.0, normalized=1.0), "TME": run,
                 "IMME": dict(run, median=1.0, normalized=1.0)}}}}
    md = imme.markdown(res, "cmd")
    assert "FAILED |" not in md and "CBE" not in md.split("\n\n", 1)[1], md
    assert "| IE | TME | IMME | IMME vs TME |" in md
    assert "| X | LAT | 1024 MiB | 512 MiB | 1.00 | 2.00 | 1.00 | 2.00x |" in md
    assert "| x | 0/5/7 | 0/5/7 |" in md


def test_no_room_when_the_programs_own_memory_fills_the_limit():
    # DL and SC at 30% (2026-11-28): the interpreter and small objects alone held more than
    # the limit, and the runs were OOM-killed whatever Attune did. They are not run now,
    # and the table says why, with the figures.
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import imme
    mib = 1 << 20
    assert imme.no_room("pool", 102 * mib, 116 * mib).startswith("116 MiB held outside")
    assert imme.no_room("pool", 102 * mib, 95 * mib) is not None      # 8 MiB least budget
    assert imme.no_room("pool", 102 * mib, 94 * mib) is None
    assert imme.no_room("file", 102 * mib, 116 * mib) is not None
    assert imme.no_room("emulated", 102 * mib, 116 * mib) is None    # far memory outside any limit
    from types import SimpleNamespace
    bar = SimpleNamespace(update=lambda n=1: None, set_description=lambda d: None)
    x = imme.measure("IMME", ["/bin/false"], 102 * mib, 8 * mib, "BW", 1, bar, "dl",
                     far=imme.Far("pool", None), room=124 * mib, held=116 * mib)
    assert not x["ok"] and x["no_room"] and not x["oom_killed"]
    # CBE is measured as before: only Attune's runs need room for a budget.
    assert imme.no_room("pool", 102 * mib, 116 * mib) and "no_room" not in imme.measure(
        "IE", ["/bin/true"], 102 * mib, 8 * mib, "BW", 1, bar, "dl", held=116 * mib)
    res = {"date": "d", "reps": 1, "outside": 0.7, "far": "pool", "workloads": {"dl": {
        "title": "DL", "flags": "BW", "footprint": 342 * mib, "budget": 102 * mib,
        "envs": {"IE": {"ok": True, "cut": False, "median": 1.0, "min": 1.0, "max": 1.0, "normalized": 1.0,
                        "majflt": 0, "minflt": 0, "moved_pages": 0},
                 "IMME": dict(x, normalized=float("nan"))}}}}
    md = imme.markdown(res, "cmd")
    assert "| DL | BW | 342 MiB | 102 MiB | 1.00 | no room |" in md, md
    assert "no room: not run" in md and "dl: 116 MiB held outside Attune's regions against a 102 MiB limit" in md
