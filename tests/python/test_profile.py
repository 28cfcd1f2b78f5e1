"""attune profile on programs with a known access distribution: 10% of the pages take 90%
of the accesses (the curve is recovered within the tolerance in docs/design.md), and a
uniform one; the data stays intact under sampling; outputs and exit status."""
import json
import os
import shutil
import subprocess
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATT = os.path.join(ROOT, "build", "bin", "attune")
pytestmark = pytest.mark.skipif(not os.path.exists(ATT), reason="make build first")


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    exe = tmp_path_factory.mktemp("bin") / "skewed"
    subprocess.run(["gcc", "-O2", os.path.join(ROOT, "tests", "run", "skewed.c"), "-o", str(exe)], check=True)
    return str(exe)


def profile(tmp_path, *prog, dram="1G"):
    r = subprocess.run([ATT, "profile", "--json", "--out", str(tmp_path), "--dram", dram, "--", *prog],
                       capture_output=True, text=True, timeout=300)
    return r


def waited(p, stderr):
    """Whether the hypervisor stole enough CPU time that the profile says its curve is not
    to be trusted (then it must say so, and record nothing): a thread's clock may run
    through steal (docs/design/prediction.md, "A program that waits for a CPU"), and the
    tests' bounds hold only otherwise. Run-queue waits do not count: the samples are
    timed by the program's own clock."""
    c = p["cpu"]
    assert c["ran_seconds"] > 0 and 0 <= c["waited_share"] <= 1, c
    if c["contended"]:
        assert "hypervisor stole" in stderr and "recorded in" not in stderr, stderr
        print("contended:", c)
    return c["contended"]


def test_skewed_curve_recovered(tmp_path, skewed):
    # 1 GiB: a hot page is touched every ~200 us, well inside the sampler's resolution
    # (two delivery floors, 40-60 us here). At 128 MiB a hot page was touched every
    # ~40 us, at the limit: the curve read 0.72-0.88 at the top 10% by the host's speed
    # and load (0.72 failed the CI run of 2026-11-26), 0.89-0.91 at 1 GiB quiet or with
    # both cores busy (docs/design/prediction.md).
    r = profile(tmp_path, skewed, "1024", "4", dram="2G")
    assert r.returncode == 0, r.stderr
    assert "skewed: OK" in r.stdout            # checksum across thousands of parked samples
    p = json.loads(r.stdout[r.stdout.index("{"):])
    print("top10", p["top10_share"], "top20", p["top20_share"], "sampling", p["sampling"])
    # Truth: 0.900 at 10% of pages, 0.911 at 20%. Tolerance 0.10 and 0.08 (measured
    # 0.889-0.910 and 0.916-0.947 on 2026-11-27).
    assert abs(p["top10_share"] - 0.90) <= 0.10
    assert abs(p["top20_share"] - 0.911) <= 0.08
    (reg,) = p["regions"]
    # Truth 0.089 (80% of the accesses); measured 0.08 quiet, 0.05-0.06 with both cores
    # busy (the mixture then gives the hottest pages a faster component of their own).
    assert reg["suggested_flags"] == "LAT,CAP" and 0.04 <= reg["suggested_hot_share"] <= 0.2
    for f in ("profile.json", "curve.csv", "timeline.csv", "summary.txt"):
        assert (tmp_path / f).stat().st_size > 0
    assert p["timeline"] and p["sources"]["hardware_counters"].startswith("not used")
    assert p["tier_access_share"]["far_estimated"] < 0.01      # everything fits in DRAM
    # perf software events cover the launcher and the program; /proc only the program.
    assert p["faults"]["perf_minor"] >= p["faults"]["os_minor"] > 0


def test_under_a_budget(tmp_path, skewed):
    # 64 MiB at a 16 MiB budget: most cold pages are in the far tier, where the sampler
    # times them as they stand (leaving them out confined the curve to DRAM's pages).
    r = profile(tmp_path, skewed, "64", "4", dram="16M")
    assert r.returncode == 0, r.stderr
    assert "skewed: OK" in r.stdout
    p = json.loads(r.stdout[r.stdout.index("{"):])
    t = p["tier_access_share"]
    print("top10", p["top10_share"], t)
    assert abs(p["top10_share"] - 0.90) <= 0.15
    # Far-tier loads less the sampler's: a few percent of the accesses (truth ~8-12%: the
    # cold tenth of the accesses, most of it beyond the budget; measured 0.03-0.16, the
    # total being the sampler's estimate), far below the capacity ratio.
    assert 0.01 < t["far_estimated"] < 0.3 and t["capacity_ratio"] > 0.6


def test_uniform_curve_is_near_the_diagonal(tmp_path, skewed):
    r = profile(tmp_path, skewed, "64", "3", "50", "50")   # 50% of pages take 50%
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout[r.stdout.index("{"):])
    print("top10", p["top10_share"], "top50", p["top50_share"])
    if waited(p, r.stderr):
        return
    # 0.12-0.14 at the top 10% on a quiet host (top 50%: about 0.5). On 2026-11-23 this
    # machine gave 0.12-0.36 (top 50%: 0.55-0.92) run to run, with this build and the one
    # before alike: a fault's delivery delay varies with how the two cores are scheduled,
    # and the per-run floor estimate with it. What must hold anywhere: a uniform program is
    # never read as skewed (the 10/90 program measures 0.8-0.9 here) nor split LAT,CAP.
    assert p["top10_share"] < 0.4
    assert p["regions"][0]["suggested_flags"] != "LAT,CAP"


def test_phases_get_their_own_curves(tmp_path, skewed):
    r = subprocess.run([ATT, "profile", "--json", "--out", str(tmp_path), "--dram", "1G", "--", skewed, "64", "3"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PHASES": "1"})
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout[r.stdout.index("{"):])
    ph = {x["name"]: x for x in p["phases"]}
    print({k: (v["top10_share"], v["sampled_chunks"], v["seconds"]) for k, v in ph.items()})
    assert set(ph) == {"uniform", "skewed"}
    assert 2.5 < ph["skewed"]["seconds"] < 4
    if waited(p, r.stderr):
        return
    assert ph["uniform"]["top10_share"] < 0.4   # see test_uniform_curve_is_near_the_diagonal
    assert ph["skewed"]["top10_share"] > 0.6   # 0.73-0.85 measured; uniform 0.12-0.14


def test_phase_calls_without_sampling():
    # Under plain attune run the phase symbols exist too; ending with none open is EINVAL.
    r = subprocess.run(["python3", "-c", "import ctypes, sys; lib = ctypes.CDLL(None); "
                        "print(lib.attune_phase_end(), lib.attune_phase_begin(b'x'), lib.attune_phase_end())"],
                       capture_output=True, text=True, env={**os.environ, "LD_PRELOAD": os.path.join(ROOT, "build", "lib", "libattune_preload.so")})
    assert r.stdout.split() == ["-1", "0", "0"], r.stdout + r.stderr


def test_exit_status_and_bad_input(tmp_path):
    r = subprocess.run([ATT, "profile", "--out", str(tmp_path), "--", "sh", "-c", "exit 3"], capture_output=True, text=True)
    assert r.returncode == 3
    r = subprocess.run([ATT, "profile", "--rate", "0", "--", "true"], capture_output=True, text=True)
    assert r.returncode == 2 and "--rate 0" in r.stderr
    r = subprocess.run([ATT, "profile", "--interval", "5", "--", "true"], capture_output=True, text=True)
    assert r.returncode == 2 and "--interval 5" in r.stderr
    r = subprocess.run([ATT, "profile", "--out", "/proc/no-such-dir", "--", "true"], capture_output=True, text=True)
    assert r.returncode == 2 and "cannot create /proc/no-such-dir" in r.stderr
    r = subprocess.run([ATT, "profile", "--window-us", "10", "--out", str(tmp_path), "--", "true"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "sample_window_us" in r.stderr and "between" in r.stderr
    r = subprocess.run([ATT, "profile", "--out", str(tmp_path), "--", "/no/such/prog"], capture_output=True, text=True)
    assert r.returncode == 127


def test_a_program_on_the_c_api_is_profiled(tmp_path):
    """A program linked against libattune (allocate_TM/free_TM, phase marks) under
    `attune profile`: its calls bind to the interposer's copy of the API, so the one
    runtime samples its region and reports it; the curve is recovered as for malloc."""
    build = os.path.join(ROOT, "build")
    exe = tmp_path / "capi_skewed"
    subprocess.run(["gcc", "-O2", f"-I{build}/include", f"-I{ROOT}/tests/run", os.path.join(ROOT, "tests", "run", "capi_skewed.c"),
                    "-o", str(exe), f"-L{build}/lib", "-lattune", f"-Wl,-rpath,{build}/lib"], check=True)
    out = tmp_path / "prof"
    r = subprocess.run([ATT, "profile", "--out", str(out), "--dram", "1G", "--", str(exe), "128", "3"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, PHASES="1"))
    assert r.returncode == 0 and "skewed: OK" in r.stdout, r.stderr
    p = json.loads((out / "profile.json").read_text())
    regions = [g for g in p["regions"] if g["size"] == 128 << 20]
    assert len(regions) == 1, p["regions"]
    assert regions[0]["sampled_chunks"] > 1000
    ph = {x["name"]: x for x in p["phases"]}
    assert set(ph) == {"uniform", "skewed"}
    if not waited(p, r.stderr):
        assert ph["skewed"]["top10_share"] > 0.6 > 0.3 > ph["uniform"]["top10_share"], ph
    # And under attune run: one runtime, its faults in the report.
    rep = tmp_path / "r.json"
    r = subprocess.run([ATT, "run", "--dram", "16M", "--report", str(rep), "--", str(exe), "32", "1"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, ATTUNE_HISTORY="off"))
    assert r.returncode == 0 and "skewed: OK" in r.stdout, r.stderr
    t = json.loads(rep.read_text())["totals"]
    assert t["faults"] > 0 and t["managed_requests"] == 0, t   # through the API, not malloc


@pytest.fixture
def shared_dir():
    """A directory the user `nobody` can write in, and the skewed program in it."""
    d = tempfile.mkdtemp(prefix="attune-profile-", dir="/tmp")
    os.chmod(d, 0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("user", [None, "nobody"])
def test_a_program_that_waits_for_a_cpu_is_profiled_by_its_own_clock(shared_dir, skewed, user):
    """The program beside four busy loops on the machine's two CPUs: it runs about a third
    of the time, in slices. Its samples are timed by its own CPU clock, so its phases read
    as they would alone, and the profile is recorded, with the wait noted in the summary.
    Timed in wall time, the same run read its uniform phase 0.43-0.56 at the top tenth
    (skewed 0.62-0.85); by the program's clock 0.12-0.13 (skewed 0.77-0.79;
    docs/design/prediction.md, "A program that waits for a CPU"). Also as nobody: thread
    clocks and run-queue times come from the program's own entries."""
    d = shared_dir
    prog = os.path.join(d, "skewed")
    shutil.copy(skewed, prog)
    os.chmod(prog, 0o755)
    hist = os.path.join(d, "history.json")
    env = dict(os.environ, ATTUNE_HISTORY=hist, PHASES="1")
    wrap = ["runuser", "-u", user, "--"] if user else []
    burners = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(4)]
    try:
        r = subprocess.run(wrap + [ATT, "profile", "--out", f"{d}/busy", "--dram", "1G", "--", prog, "64", "3"],
                           capture_output=True, text=True, timeout=300, env=env)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert r.returncode == 0 and "skewed: OK" in r.stdout, r.stderr
    with open(f"{d}/busy/profile.json") as f:
        p = json.load(f)
    assert p["cpu"]["waited_share"] > 0.3 and p["cpu"]["waited_seconds"] > 0.5, p["cpu"]
    with open(f"{d}/busy/summary.txt") as f:
        assert "cpu: the program waited for a CPU" in f.read()
    ph = {x["name"]: x["top10_share"] for x in p["phases"]}
    print(ph, p["cpu"])
    if waited(p, r.stderr):
        return
    assert "recorded in" in r.stderr and os.path.exists(hist), r.stderr
    assert ph["uniform"] < 0.3 and ph["skewed"] > 0.65, ph


@pytest.mark.parametrize("user", [None, "nobody"])
@pytest.mark.parametrize("mode,secs,arg", [("churn", "4", "80"), ("fork", "3", "70")])
def test_threads_the_profile_has_not_seen_yet_are_timed(shared_dir, mode, secs, arg, user):
    """The samples' clock follows the threads a program has now: `churn` runs each phase
    in successive threads of 80 ms (100 over the run, a thread per task); `fork` runs both
    phases in a child forked from a parent with 70 idle threads. Before (2026-12-07), the
    clock kept the first 64 threads of a run, ended or not, and a forked child kept its
    parent's: once those ended, and in the child at once, it stood still. The skewed phase
    then read 0.56-0.57 at its top tenth from 1064-1263 sampled chunks (churn), and the
    child sampled 0-104 chunks in all (fork); now 0.83-0.88 and 0.83-0.88, from 2500 or
    more (uniform 0.14-0.28 and 0.14-0.16). Shorter tasks:
    test_tasks_of_a_few_milliseconds_are_timed_from_start_to_end. Also as nobody: the threads are listed from
    the program's own /proc entries."""
    threads_run(shared_dir, mode, secs, [arg], user)


@pytest.mark.parametrize("user", [None, "nobody"])
def test_tasks_of_a_few_milliseconds_are_timed_from_start_to_end(shared_dir, user):
    """A thread per 5 ms task (800 over the run, every second one ending by pthread_exit):
    the interposer's pthread_create has each followed from its first instruction to its
    end. Before (2026-12-07) a thread was followed from the sampler's next listing (up to
    a loop after its start) to its last reading, the clock stood still in between and
    touches then read as hot: 10 ms tasks read uniform 0.43-0.44 and skewed 0.55-0.60 at
    the top tenth; now 0.13-0.14 and 0.80-0.87 with 1-10 ms tasks, as root and as nobody
    (docs/design/prediction.md, "Threads followed from start to end"). What the threads
    ran and waited for a CPU counts each task too (a spinning task runs or waits the whole
    8 s): before, the report saw the main thread and the few tasks alive at a report,
    0.14 s run and 0.27 s waited; now 6.6 s and 1.4 s beside a CI run."""
    p = threads_run(shared_dir, "churn", "4", ["5"], user)
    cpu = p["cpu"]
    assert cpu["ran_seconds"] + cpu["waited_seconds"] > 6, cpu


def test_a_program_that_has_started_thousands_of_threads_is_still_timed(shared_dir):
    """20000 threads of 3 ms, 64 at a time, before the churn's phases: the clock follows
    64 threads at once and gives an ended thread's slot to the next. Before (2026-12-07)
    a slot was never given again, 4096 in all: once they were used the clock stood still,
    and the phases read uniform 0.75 and skewed 0.10 from 522 and 149 sampled chunks;
    now 0.14 and 0.85 from 3362 and 3344 (docs/design/prediction.md, "Threads that come
    and go")."""
    threads_run(shared_dir, "churn", "4", ["80", "20000"], None)


def threads_run(d, mode, secs, args, user):
    """`attune profile` of `threads_skewed MODE 64 SECS ARGS...` (as `user`): both phases
    sampled, each read as what it is."""
    exe = os.path.join(d, "threads_skewed")
    subprocess.run(["gcc", "-O2", "-pthread", os.path.join(ROOT, "tests", "run", "threads_skewed.c"), "-o", exe],
                   check=True)
    os.chmod(exe, 0o755)
    wrap = ["runuser", "-u", user, "--"] if user else []
    env = dict(os.environ, ATTUNE_HISTORY=os.path.join(d, "history.json"))
    r = subprocess.run(wrap + [ATT, "profile", "--json", "--out", os.path.join(d, "out"), "--dram", "1G", "--",
                               exe, mode, "64", secs, *args],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and f"threads_skewed: OK {mode}" in r.stdout, r.stdout + r.stderr
    p = json.loads(r.stdout[r.stdout.index("{"):])
    ph = {x["name"]: x for x in p["phases"]}
    print({k: (v["top10_share"], v["sampled_chunks"]) for k, v in ph.items()})
    assert set(ph) == {"uniform", "skewed"}
    assert ph["uniform"]["sampled_chunks"] > 1800 and ph["skewed"]["sampled_chunks"] > 1800, ph
    if waited(p, r.stderr):
        return p
    # The uniform bound is test_uniform_curve_is_near_the_diagonal's.
    assert ph["uniform"]["top10_share"] < 0.4 and ph["skewed"]["top10_share"] > 0.65, ph
    return p
