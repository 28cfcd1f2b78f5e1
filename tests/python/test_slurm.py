"""Attune's SPANK plugin under a real Slurm (slurm_cluster.py; docs/slurm.md): jobs ask
for tiered memory at submission with --tm-* options of srun and sbatch (#SBATCH lines
too); each task gets the interposer and its settings; a bad value is refused with the
plugin's message in the runtime's words; a program twice its --mem finishes within the
limit under Attune where it is OOM-killed without; the job's budget shows in the node
daemon's status and scancel releases it; array tasks are workflows of their own. Jobs
are submitted as nobody, as HPC users are not root.

Needs root (slurmd, cgroups) and the staged build (make build with libslurm-dev)."""
import ctypes
import json
import os
import random
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from slurm_cluster import BUILD, PLUGIN, ROOT, Slurm, accounting_available, available
from test_daemon import Daemon

ATTUNE = BUILD / "bin" / "attune"
MIB = 1 << 20
HEADROOM = 32 * MIB  # the plugin's floor: 10% of a limit below 320 MiB is less

why = available()
pytestmark = pytest.mark.skipif(why is not None, reason=why or "")


@pytest.fixture(scope="module")
def slurm():
    # With job accounting where slurmdbd and MariaDB are installed (scripts/setup.sh does),
    # as a site runs it: sacct then shows the jobs' summaries.
    s = Slurm(accounting=accounting_available() is None)
    # The node daemon, as a site would run it: its socket named in plugstack.conf.
    s.metrics = random.randrange(20000, 40000)
    d = Daemon(s.dir, "--dram", "2G", "--far-pool", "512M", sock=str(s.dir / "attuned.sock"),
               metrics=f"127.0.0.1:{s.metrics}")
    s.write_plugstack([f"socket={d.sock}"])
    s.daemon = d
    for prog in ("c_matrix", "crash"):
        subprocess.run(["gcc", "-O2", str(ROOT / f"tests/run/{prog}.c"), "-o", str(s.jobs / prog)],
                       check=True)
    subprocess.run(["gcc", "-O2", f"-I{BUILD}/include", f"-I{ROOT}/tests/c", str(ROOT / "tests/daemon/client.c"),
                    "-o", str(s.jobs / "client"), f"-L{BUILD}/lib", "-lattune", f"-Wl,-rpath,{BUILD}/lib",
                    "-lpthread"], check=True)
    yield s
    d.stop()
    s.stop()


def task_env(out):
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_srun_options_reach_each_task(slurm):
    p = slurm.run(["srun", "--mem=200M", "--ntasks=2", "--tm-flags=cap,LAT", "--tm-far=file",
                   "sh", "-c", "env | grep -E '^(ATTUNE_|TM_|LD_PRELOAD|SLURM_JOB_ID=)' | sort"],
                  user="nobody")
    assert p.returncode == 0, p.stderr
    # Two tasks, each with the whole set.
    lines = p.stdout.splitlines()
    assert sum(line.startswith("ATTUNE_FLAGS=") for line in lines) == 2, p.stdout
    e = task_env(p.stdout)
    assert e["ATTUNE_FLAGS"] == e["TM_FLAGS"] == "cap,LAT"
    assert str(BUILD / "lib" / "libattune_preload.so") in e["LD_PRELOAD"]
    assert e["ATTUNE_WORKFLOW"] == f"slurm-{e['SLURM_JOB_ID']}"
    assert e["ATTUNE_FAR"] == "file" and e["ATTUNE_TIER_FILE_DIRECT"] == "true"
    # --mem is per node: the limit less the headroom, divided between the two tasks.
    assert int(e["ATTUNE_DRAM"]) == (200 * MIB - HEADROOM) // 2, e


def test_a_job_without_tm_options_is_not_touched(slurm):
    p = slurm.run(["srun", "--mem=100M", "sh", "-c", "env | grep -cE '^(ATTUNE_|LD_PRELOAD=)' || true"])
    assert p.returncode == 0 and p.stdout.strip() == "0", p.stdout + p.stderr


def test_sbatch_lines_reach_the_batch_step_and_its_sruns(slurm):
    out = slurm.jobs / "sbatch.out"
    job = slurm.sbatch(f"""#!/bin/sh
#SBATCH --mem=300M
#SBATCH --tm-flags=LAT
#SBATCH --tm-dram=50%
#SBATCH --output={out}
echo batch ATTUNE_FLAGS=$ATTUNE_FLAGS ATTUNE_DRAM=$ATTUNE_DRAM ATTUNE_FAR=$ATTUNE_FAR
srun sh -c 'echo step ATTUNE_FLAGS=$ATTUNE_FLAGS ATTUNE_DRAM=$ATTUNE_DRAM'
""", user="nobody")
    assert slurm.wait(job) == "COMPLETED", out.read_text() if out.exists() else ""
    text = out.read_text()
    half = 150 * MIB
    # The node daemon's socket exists: its pool first, then the file tier.
    assert f"batch ATTUNE_FLAGS=LAT ATTUNE_DRAM={half} ATTUNE_FAR=pool,file" in text, text
    assert f"step ATTUNE_FLAGS=LAT ATTUNE_DRAM={half}" in text, text


def runtime_message(option, value):
    """What `attune run` says of the same value (the plugin must use the runtime's words)."""
    p = subprocess.run([str(ATTUNE), "run", f"--{option}", value, "--", "true"], capture_output=True,
                       text=True)
    assert p.returncode != 0, f"attune run accepted --{option} {value}"
    return p.stderr


@pytest.mark.parametrize("option,value,says", [
    ("tm-flags", "FOO", "unknown flag 'FOO' (expected LAT, BW, CAP, SHL or auto)"),
    ("tm-flags", "LAT,fast", "unknown flag 'FAST'"),
    ("tm-dram", "12X", "'12X' is not a size"),
    ("tm-dram", "0", "the budget must be more than 0 bytes"),
    ("tm-dram", "64K", "65536 bytes is too small (at least 1.0 MiB)"),
    ("tm-dram", "150%", "a percentage must be"),
    ("tm-far", "remote", "'remote' is not a far tier kind"),
    ("tm-far", "file,file", "'file' is named twice"),
    ("tm-workflow", "a b", "1-128 printable characters"),
    ("tm-config", "/nonexistent.toml", "cannot read the configuration file"),
])
def test_a_bad_value_is_refused_with_the_plugins_message(slurm, option, value, says):
    for cmd in (["srun", f"--{option}={value}", "true"], ["sbatch", f"--{option}={value}", "--wrap=true"]):
        p = slurm.run(cmd, user="nobody")
        assert p.returncode != 0, f"{cmd} was accepted"
        assert f"attune: --{option}={value}: " in p.stderr and says in p.stderr, p.stderr
    # Nothing was queued.
    assert slurm.run(["squeue", "-h"]).stdout.strip() == ""
    # Where `attune run` has the same option, it says the same.
    same = {"tm-flags": "flags", "tm-far": "far"}.get(option)
    if same:
        assert says in runtime_message(same, value)


def test_the_plugins_grammar_is_the_runtimes():
    """The checks the plugin exports, against `attune run`'s, value by value (flags, budget,
    far tiers)."""
    lib = ctypes.CDLL(str(PLUGIN), mode=os.RTLD_LAZY)
    why = ctypes.create_string_buffer(256)
    for v in ["LAT", "lat,bw", "CAP|SHL", "bw+cap", " LAT , BW ", "auto", "none", "", ",",
              "LAT,", "FOO", "LAT;BW", "lat bw", "L AT"]:
        plugin_ok = lib.attune_check_flags(v.encode(), why, 256) == 0
        rt = subprocess.run([str(ATTUNE), "run", "--flags", v, "--", "true"], capture_output=True, text=True)
        assert plugin_ok == (rt.returncode == 0), f"flags {v!r}: plugin {plugin_ok}, runtime {rt.stderr}"
    for v in ["4096", "1048576", "64K", "1024k", "2M", "1.5G", "1GiB", "1GB", "1T", "3%", "100%", "0.5%",
              "12X", "1.2.3", "-1M", "K", "M1", " 8M ", "1e7", "0", "0.0M", "101%"]:
        plugin_ok = lib.attune_check_dram(v.encode(), why, 256) == 0
        rt = subprocess.run([str(ATTUNE), "run", "--dram", v, "--", "true"], capture_output=True, text=True)
        assert plugin_ok == (rt.returncode == 0), f"dram {v!r}: plugin {plugin_ok} {why.value}, runtime {rt.stderr}"
    for v in ["pool", "file", "memory", "pool,file", "file,memory,pool", "remote", "numa", "file,file", "",
              "pool,,file", "Pool", "pool file"]:
        plugin_ok = lib.attune_check_far(v.encode(), why, 256) == 0
        rt = subprocess.run([str(ATTUNE), "run", "--far", v, "--", "true"], capture_output=True, text=True)
        assert plugin_ok == (rt.returncode == 0), f"far {v!r}: plugin {plugin_ok} {why.value}, runtime {rt.stderr}"


def test_attune_report_says_why_a_directory_cannot_be_read():
    """attune report's error paths, as a user who is not root: a missing directory and one it
    may not read are clear errors naming the cause (exit 2); an empty one says that no
    process was managed."""
    import shutil
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="attune-report-"))
    try:
        os.chmod(d, 0o755)
        (d / "private").mkdir(mode=0o700)

        def report(path):
            return subprocess.run(["runuser", "-u", "nobody", "--", str(ATTUNE), "report", "--oneline", str(path)],
                                  capture_output=True, text=True)
        p = report(d / "no")
        assert p.returncode == 2 and "cannot read" in p.stderr and "No such file or directory" in p.stderr, p.stderr
        p = report(d / "private")
        assert p.returncode == 2 and "Permission denied" in p.stderr, p.stderr
        p = report(d)
        assert p.returncode == 0 and p.stdout.strip() == "attune: no managed process", p.stdout + p.stderr
    finally:
        shutil.rmtree(d)


def test_a_job_twice_its_memory_finishes_within_the_limit_with_attune(slurm):
    """c_matrix at 400 MiB (432 MiB footprint) under --mem=200M: OOM-killed without Attune;
    with --tm-flags=CAP every buffer verifies and the task's memory cgroup peaks under the
    limit, with the far pages in a file (O_DIRECT) or in the node daemon's pool."""
    p = slurm.run(["srun", "--mem=200M", "./c_matrix", "400"], user="nobody")
    assert p.returncode != 0 and "Out Of Memory" in p.stderr, p.stdout + p.stderr
    # The task's own cgroup, read by the task (VmHWM would count the pool's shared pages,
    # which are charged to attuned).
    peak = "cat /sys/fs/cgroup/memory$(grep :memory: /proc/self/cgroup | cut -d: -f3)/memory.max_usage_in_bytes"
    for far in ("file", "pool,file"):
        p = slurm.run(["srun", "--mem=200M", "--tm-flags=CAP", f"--tm-far={far}", "sh", "-c",
                       f"./c_matrix 400 && {peak}"], user="nobody")
        assert p.returncode == 0 and "c_matrix: OK" in p.stdout, far + p.stdout + p.stderr
        used = int(p.stdout.split()[-1])
        assert 32 * MIB < used < 200 * MIB, f"{far}: peak {used >> 20} MiB"


def test_a_budget_over_the_limit_fails_the_task_with_a_message(slurm):
    p = slurm.run(["srun", "--mem=100M", "--tm-dram=1G", "true"], user="nobody")
    assert p.returncode != 0
    assert "--tm-dram=1G for 1 task(s) is more than the job's memory on this node (100 MiB)" in p.stderr, p.stderr
    p = slurm.run(["srun", "--mem=34M", "--tm-flags=CAP", "true"], user="nobody")
    assert p.returncode != 0 and "leaves no DRAM budget after the 32 MiB headroom" in p.stderr, p.stderr


def workflows(slurm, name):
    st = json.loads(subprocess.run([str(ATTUNE), "status", "--json", "--socket", slurm.daemon.sock],
                                   capture_output=True, text=True, check=True).stdout)
    return [w for w in st["workflows"] if w["name"] == name]


def test_the_budget_shows_in_the_daemon_and_scancel_releases_it(slurm):
    """A LAT job whose 32 MiB are more than its 16 MiB budget: the daemon shows the
    workflow slurm-JOB of user nobody wanting exactly the budget; scancel releases it."""
    job = slurm.sbatch("#!/bin/sh\nexec ./crash sleep\n", "--mem=256M", "--tm-flags=LAT", "--tm-dram=16M",
                       user="nobody")
    name = f"slurm-{job}"
    w = []
    for _ in range(300):
        w = workflows(slurm, name)
        if w and w[0]["want"] == 16 * MIB:
            break
        time.sleep(0.1)
    assert w and w[0]["want"] == 16 * MIB, f"{name}: {w}"
    assert w[0]["flags"] == "LAT" and w[0]["uid"] == 65534, w
    # The job as slurmd's cgroup names it, also a label of the Prometheus series.
    assert w[0]["job"] == job, w
    text = urllib.request.urlopen(f"http://127.0.0.1:{slurm.metrics}/metrics", timeout=5).read().decode()
    assert f'attune_workflow_want_bytes{{workflow="{name}",uid="65534",job="{job}",flags="LAT"}} {16 * MIB}' in text, text
    slurm.run(["scancel", job], user="nobody")
    assert slurm.wait(job) == "CANCELLED"
    for _ in range(100):
        if not workflows(slurm, name):
            break
        time.sleep(0.1)
    assert not workflows(slurm, name), "the cancelled job still holds its grant"


def test_array_tasks_are_workflows_of_their_own(slurm):
    out = slurm.jobs / "array-%a.out"
    job = slurm.sbatch("#!/bin/sh\necho $ATTUNE_WORKFLOW\n", "--array=0-1", "--mem=100M",
                       "--tm-flags=CAP", f"--output={out}", user="nobody")
    for i in (0, 1):
        slurm.wait(f"{job}_{i}")
    names = sorted((slurm.jobs / f"array-{i}.out").read_text().strip() for i in (0, 1))
    assert names == [f"slurm-{job}_0", f"slurm-{job}_1"], names


def comment_of(slurm, job):
    out = slurm.run(["scontrol", "-o", "show", "job", job]).stdout
    m = re.search(r"Comment=(.*?)(?= [A-Z][A-Za-z]*=|$)", out)
    return m.group(1).strip() if m else ""


def test_the_jobs_summary_becomes_its_comment_and_its_files_go(slurm):
    """A batch job with two steps: the comment names both processes of c_matrix, their far
    bytes in the file tier, faults and time in faults; the job's private statistics
    directory is gone after the job."""
    job = slurm.sbatch("#!/bin/sh\nsrun ./c_matrix 300 && srun ./c_matrix 300\n", "--mem=200M",
                       "--tm-flags=CAP", "--tm-far=file", user="nobody")
    assert slurm.wait(job) == "COMPLETED"
    c = comment_of(slurm, job)
    m = re.fullmatch(r"attune: (\d+) process\(es\), peak DRAM ([\d.]+) MiB, far ([\d.]+) (MiB|GiB) "
                     r"\(file\), (\d+) faults, ([\d.]+) s in faults, .* moved", c)
    assert m, c
    # The two c_matrix processes (the batch shell allocates nothing large: no engine).
    assert int(m.group(1)) == 2 and int(m.group(5)) > 1000 and float(m.group(6)) > 0, c
    # Within the budget (the limit less 32 MiB) plus one run of chunks.
    assert float(m.group(2)) <= 168.0 + 2, c
    for _ in range(50):
        if not os.path.exists(f"/tmp/attune-slurm-65534/{job}"):
            break
        time.sleep(0.1)
    assert not os.path.exists(f"/tmp/attune-slurm-65534/{job}"), "the job's statistics stay behind"


@pytest.mark.skipif(accounting_available() is not None, reason=accounting_available() or "")
def test_the_jobs_summary_shows_in_sacct(slurm):
    """With slurmdbd and AccountingStoreFlags=job_comment, the summary the plugin put in
    the job's comment is what sacct shows the user after the job."""
    job = slurm.sbatch("#!/bin/sh\nsrun ./c_matrix 300\n", "--mem=200M", "--tm-flags=CAP",
                       "--tm-far=file", user="nobody")
    assert slurm.wait(job) == "COMPLETED"
    out = ""
    for _ in range(150):
        out = slurm.run(["sacct", "-n", "-X", "-j", job, "-o", "JobID,State,Comment%300"],
                        user="nobody").stdout
        if "attune:" in out:
            break
        time.sleep(0.2)
    assert re.search(rf"^\s*{job}\s+COMPLETED\s+attune: 1 process\(es\), peak DRAM [\d.]+ MiB, far "
                     r"[\d.]+ (MiB|GiB) \(file\), \d+ faults", out, re.M), out


@pytest.fixture(scope="module")
def cluster2():
    """Two emulated nodes (network namespaces, a slurmd each; slurm_cluster.py)."""
    s = Slurm(nodes=2)
    d = Daemon(s.dir, "--dram", "2G", sock=str(s.dir / "attuned.sock"))
    s.write_plugstack([f"socket={d.sock}"])
    subprocess.run(["gcc", "-O2", str(ROOT / "tests/run/c_matrix.c"), "-o", str(s.jobs / "c_matrix")],
                   check=True)
    yield s
    d.stop()
    s.stop()


def test_a_two_node_jobs_comment_holds_each_nodes_summary(cluster2):
    """Each node's slurmstepd puts its own part in the comment (they finish together and
    read each other's part back), and each node's statistics are its own."""
    s = cluster2
    job = s.sbatch("#!/bin/sh\nsrun ./c_matrix 300\n", "-N2", "--ntasks-per-node=1", "--mem=200M",
                   "--tm-flags=CAP", "--tm-far=file", user="nobody")
    assert s.wait(job) == "COMPLETED", s.show(job)
    c = comment_of(s, job)
    part = r"1 process\(es\), peak DRAM [\d.]+ MiB, far [\d.]+ (MiB|GiB) \(file\), \d+ faults"
    m = re.fullmatch(rf"attune: {s.nodes[0]}: {part}.*; {s.nodes[1]}: {part}.*", c)
    assert m, c
    for _ in range(50):
        if not os.path.exists(f"/tmp/attune-slurm-65534/{job}"):
            break
        time.sleep(0.1)
    assert not os.path.exists(f"/tmp/attune-slurm-65534/{job}"), "the job's statistics stay behind"


def region_gone(slurm, name, timeout=10):
    """Whether the daemon's shared region `name` is gone, waiting up to `timeout` s."""
    t0 = time.time()
    while any(r["name"] == name for r in daemon_status(slurm)["shared"]):
        if time.time() - t0 > timeout:
            return False
        time.sleep(0.1)
    return True


def daemon_status(slurm):
    return json.loads(subprocess.run([str(ATTUNE), "status", "--json", "--socket", slurm.daemon.sock],
                                     capture_output=True, text=True, check=True).stdout)


def test_two_users_jobs_cannot_open_each_others_shared_regions(slurm):
    """nobody's job creates a shared region; another user's job on the node is refused it,
    a second job of nobody reads it; when the creating job is cancelled the region goes."""
    job = slurm.sbatch("#!/bin/sh\nexec ./client write slurmshared 16 60\n", "--mem=200M", "--tm-flags=CAP",
                       user="nobody")
    for _ in range(300):
        if any(r["name"] == "slurmshared" for r in daemon_status(slurm)["shared"]):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the shared region never appeared")
    p = slurm.run(["srun", "--mem=100M", "--tm-flags=CAP", "./client", "refused", "slurmshared"], user="daemon")
    assert p.returncode == 0, p.stdout + p.stderr
    p = slurm.run(["srun", "--mem=100M", "--tm-flags=CAP", "./client", "read", "slurmshared", "16"], user="nobody")
    assert p.returncode == 0, p.stdout + p.stderr
    slurm.run(["scancel", job], user="nobody")
    slurm.wait(job)
    assert region_gone(slurm, "slurmshared"), "the region outlived its users"


def test_the_plugin_starts_attuned_at_the_first_job_where_none_runs():
    """plugstack `attuned=`: the first job's prolog starts the daemon, detached and outside
    every job's cgroup; it outlives the job and serves the next one."""
    s = Slurm()
    sock = s.dir / "auto.sock"
    pid = None
    try:
        s.write_plugstack([f"attuned={BUILD / 'bin' / 'attuned'}", f"socket={sock}"])
        subprocess.run(["gcc", "-O2", str(ROOT / "tests/run/crash.c"), "-o", str(s.jobs / "crash")], check=True)
        assert not sock.exists()
        p = s.run(["srun", "--mem=100M", "--tm-flags=CAP", "sh", "-c", "echo $ATTUNE_FAR"], user="nobody")
        assert p.returncode == 0, p.stderr
        # The daemon was up before the task started: its pool was offered.
        assert p.stdout.strip() == "pool,file", p.stdout
        st = json.loads(subprocess.run([str(ATTUNE), "status", "--json", "--socket", sock],
                                       capture_output=True, text=True, check=True).stdout)
        pid = st["pid"]
        assert "job_" not in Path(f"/proc/{pid}/cgroup").read_text()
        # The next job registers with it.
        job = s.sbatch("#!/bin/sh\nexec ./crash sleep\n", "--mem=100M", "--tm-flags=CAP", user="nobody")
        for _ in range(300):
            st = json.loads(subprocess.run([str(ATTUNE), "status", "--json", "--socket", sock],
                                           capture_output=True, text=True, check=True).stdout)
            if any(w["name"] == f"slurm-{job}" for w in st["workflows"]):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"job {job} never registered with the started daemon")
        assert st["pid"] == pid, "a second daemon was started"
        s.run(["scancel", job])
        s.wait(job)
    finally:
        if pid:
            os.kill(pid, 15)
        s.stop()


# --- containers (docs/slurm.md, "Containers") ----------------------------------------------

def host_image(slurm, name):
    """A container image of its own: a root directory holding this host's C library (the
    same version as the interposer's), the test programs, and empty mount points for what
    the job binds in at the same paths (the library, the daemon's socket, the jobs, /tmp)."""
    img = slurm.dir / name
    if img.exists():
        return img
    for d in ("dev", "proc", "sys", "tmp", "etc", "lib64", "lib/x86_64-linux-gnu",
              str(BUILD / "lib")[1:], str(slurm.dir)[1:], str(slurm.jobs)[1:]):
        (img / d).mkdir(parents=True, exist_ok=True)
    for lib in ("libc.so.6", "libm.so.6", "libgcc_s.so.1"):
        subprocess.run(["cp", "-L", f"/lib/x86_64-linux-gnu/{lib}", str(img / "lib/x86_64-linux-gnu")], check=True)
    subprocess.run(["cp", "-L", "/lib64/ld-linux-x86-64.so.2", str(img / "lib64")], check=True)
    (img / "etc/passwd").write_text("nobody:x:65534:65534:nobody:/:/bin/false\n")
    # What Charliecloud binds over in every image.
    (img / "etc/group").write_text("nogroup:x:65534:\n")
    for f in ("hosts", "resolv.conf"):
        (img / "etc" / f).write_text("")
    for d in ("home", "mnt", "run", "usr", "var/tmp"):
        (img / d).mkdir(parents=True, exist_ok=True)
    os.chmod(img, 0o755)
    return img


def binds(slurm):
    return [str(BUILD / "lib"), str(slurm.dir), str(slurm.jobs)]


def bwrap(slurm, img, *cmd):
    argv = ["bwrap", "--unshare-user", "--unshare-pid", "--ro-bind", str(img), "/", "--dev", "/dev",
            "--proc", "/proc", "--bind", "/tmp", "/tmp"]
    for b in binds(slurm):
        argv += ["--bind", b, b]
    return [*argv, "--chdir", str(slurm.jobs), *cmd]


def chrun(slurm, img, *cmd):
    argv = ["env", "USER=nobody", "ch-run"]
    for b in binds(slurm):
        argv += ["-b", f"{b}:{b}"]
    return [*argv, "-c", str(slurm.jobs), str(img), "--", *cmd]


TASK_PEAK = "cat /sys/fs/cgroup/memory$(grep :memory: /proc/self/cgroup | cut -d: -f3)/memory.max_usage_in_bytes"


@pytest.mark.parametrize("runtime", ["bwrap", "ch-run"])
def test_a_containerized_job_is_tiered_within_its_limit(slurm, runtime):
    """c_matrix (432 MiB) in an image with its own C library, started by bubblewrap (a user
    namespace of its own) or Charliecloud from srun as nobody in --mem=200M: the library and
    the daemon's socket are bound in; every buffer verifies and the task's cgroup peaks under
    the limit; the daemon sees the job's real user through the user namespace."""
    if not __import__("shutil").which(runtime):
        pytest.skip(f"{runtime} is not installed (scripts/setup.sh)")
    img = host_image(slurm, "img-host")
    for prog in ("c_matrix", "crash"):
        subprocess.run(["cp", str(slurm.jobs / prog), str(img)], check=True)
    wrap = bwrap if runtime == "bwrap" else chrun
    cmd = " ".join(wrap(slurm, img, "/c_matrix", "400"))
    p = slurm.run(["srun", "--mem=200M", "--tm-flags=CAP", "sh", "-c", f"{cmd} && {TASK_PEAK}"], user="nobody")
    assert p.returncode == 0 and "c_matrix: OK" in p.stdout, p.stdout + p.stderr
    used = int(p.stdout.split()[-1])
    assert 32 * MIB < used < 200 * MIB, f"peak {used >> 20} MiB"
    # Peer credentials through the user namespace: the daemon sees uid 65534, not 0.
    script = "#!/bin/sh\nexec " + " ".join(wrap(slurm, img, "/crash", "sleep")) + "\n"
    job = slurm.sbatch(script, "--mem=200M", "--tm-flags=CAP", user="nobody")
    name = f"slurm-{job}"
    w = []
    for _ in range(300):
        w = workflows(slurm, name)
        if w:
            break
        time.sleep(0.1)
    slurm.run(["scancel", job])
    slurm.wait(job)
    assert w and w[0]["uid"] == 65534 and w[0]["job"] == job, w


def old_glibc_image(slurm):
    """An image with Debian bullseye's C library and its programs (glibc 2.31, older than the
    interposer's 2.34), from the private apt lists of scripts/numa-guest/fetch.sh (the 5.10
    kernel's); None if unavailable."""
    apt = Path("/var/cache/attune-guest/old/apt")
    if not (apt / "sources.list").exists():
        return None
    o = ["-o", f"Dir::Etc::SourceList={apt}/sources.list", "-o", "Dir::Etc::SourceParts=/dev/null",
         "-o", f"Dir::State::Lists={apt}/lists", "-o", f"Dir::Cache={apt}/cache"]
    def bullseye(pkg):
        pol = subprocess.run(["apt-cache", *o, "madison", pkg], capture_output=True, text=True).stdout
        return next((f"{pkg}={line.split('|')[1].strip()}" for line in pol.splitlines() if "bullseye/" in line),
                    None)
    pkgs = [bullseye(p) for p in ("libc6", "libc-bin", "libgcc-s1")]
    if None in pkgs:
        return None
    img = slurm.dir / "img-old"
    debs = slurm.dir / "debs"
    debs.mkdir(exist_ok=True)
    # libc6 holds the library, libc-bin its programs (getconf, a dynamically linked one),
    # libgcc-s1 the unwinder the interposer also needs (a Debian image has all three).
    if subprocess.run(["apt-get", *o, "-q", "download", *pkgs], cwd=debs, capture_output=True).returncode:
        return None
    for deb in debs.glob("*.deb"):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(img)], check=True)
    for d in ("dev", "proc", "tmp", str(BUILD / "lib")[1:], str(slurm.dir)[1:], str(slurm.jobs)[1:]):
        (img / d).mkdir(parents=True, exist_ok=True)
    os.chmod(img, 0o755)
    return img


def test_an_image_whose_c_library_is_too_old_fails_loudly_at_start(slurm):
    """In a bullseye image (glibc 2.31, older than the interposer's 2.34) the dynamic loader
    refuses the interposer and with it the program, naming both: the program never runs
    untiered beyond its budget."""
    img = old_glibc_image(slurm)
    if img is None:
        pytest.skip("no bullseye package lists (scripts/numa-guest/fetch.sh 5.10)")
    cmd = bwrap(slurm, img, "/usr/bin/getconf", "PAGESIZE")
    p = slurm.run(["srun", "--mem=100M", "--tm-flags=CAP", *cmd], user="nobody")
    assert p.returncode != 0 and "4096" not in p.stdout, p.stdout + p.stderr
    assert "version `GLIBC_2.34' not found (required by " + str(BUILD / "lib" / "libattune_preload.so") \
        in p.stderr, p.stderr
    # Without --tm options the same image runs.
    p = slurm.run(["srun", "--mem=100M", *cmd], user="nobody")
    assert p.returncode == 0 and p.stdout.strip() == "4096", p.stdout + p.stderr


def test_a_container_whose_seccomp_profile_forbids_userfaultfd_gets_the_fallback_message(slurm):
    """A seccomp profile that refuses userfaultfd (deny_syscalls applies it, as a container
    runtime's profile would, to the container and all it starts): the program runs on plain
    DRAM, verified, and says what to allow."""
    deny = slurm.jobs / "deny_syscalls"
    if not deny.exists():
        subprocess.run(["gcc", "-O2", str(ROOT / "tests/c/deny_syscalls.c"), "-o", str(deny)], check=True)
    img = host_image(slurm, "img-host")
    subprocess.run(["cp", str(slurm.jobs / "c_matrix"), str(img)], check=True)
    p = slurm.run(["srun", "--mem=400M", "--tm-flags=CAP", str(deny), "userfaultfd,uffd-dev", "--",
                   *bwrap(slurm, img, "/c_matrix", "64")], user="nobody")
    assert p.returncode == 0 and "c_matrix: OK" in p.stdout, p.stdout + p.stderr
    assert "allow the userfaultfd system call in the container's seccomp profile" in p.stderr, p.stderr
    assert "continuing with plain DRAM" in p.stderr, p.stderr


def test_a_jobs_staged_input_serves_its_tasks_and_goes_with_the_job(slurm):
    """nobody's batch job stages an input once; two tasks read it through `attune run
    --staged`, verified; the daemon names the job; scancel (no unstage run) frees it."""
    data = slurm.jobs / "staged-input.dat"
    data.write_bytes(os.urandom(8 * MIB))
    os.chmod(data, 0o644)
    out = slurm.jobs / "staged.out"
    script = (f"#!/bin/sh\nexport ATTUNE_SOCKET={slurm.daemon.sock}\n"
              f"{ATTUNE} stage jobin {data} || exit 1\n"
              f"srun --ntasks=2 {ATTUNE} run -q --staged jobin -- "
              f"sh -c 'cmp \"$ATTUNE_STAGED_JOBIN\" {data} && echo SAME'\n"
              "sleep 120\n")
    job = slurm.sbatch(script, "--mem=200M", "--ntasks=2", f"--output={out}", user="nobody")
    for _ in range(300):
        if out.exists() and out.read_text().count("SAME") == 2:
            break
        time.sleep(0.1)
    assert out.read_text().count("SAME") == 2, out.read_text()
    (r,) = [r for r in daemon_status(slurm)["shared"] if r["name"] == "jobin"]
    assert r["staged"] and r["job"] == job and r["owner"] == 65534 and r["size"] == 8 * MIB, r
    slurm.run(["scancel", job], user="nobody")
    slurm.wait(job)
    assert region_gone(slurm, "jobin"), "outlived its job"


def test_array_tasks_share_one_staged_copy_that_goes_after_the_last(slurm):
    """Each task of an array (jobs of their own) runs `attune stage --reuse`: one copy
    serves them all, every read verified, and it goes when the last task's job ends."""
    data = slurm.jobs / "array-input.dat"
    data.write_bytes(os.urandom(4 * MIB))
    os.chmod(data, 0o644)
    out = slurm.jobs / "stagearr-%a.out"
    script = (f"#!/bin/sh\nexport ATTUNE_SOCKET={slurm.daemon.sock}\n"
              f"{ATTUNE} stage --reuse arrin {data} || exit 1\n"
              f"{ATTUNE} run -q --staged arrin -- sh -c 'cmp \"$ATTUNE_STAGED_ARRIN\" {data} && echo SAME'\n"
              "sleep 3\n")
    job = slurm.sbatch(script, "--array=0-3", "--mem=100M", f"--output={out}", user="nobody")
    seen = set()
    for i in range(4):
        assert slurm.wait(f"{job}_{i}", timeout=120) == "COMPLETED"
    for i in range(4):
        text = (slurm.jobs / f"stagearr-{i}.out").read_text()
        assert "SAME" in text, text
        seen.add("staged already" in text)
    assert seen == {True, False}, "one task copied, the others reused"
    assert region_gone(slurm, "arrin"), "outlived its jobs"


def test_an_array_ensemble_of_tiered_jobs_finishes_verified(slurm):
    """The ensemble at small size: 8 array tasks of one workflow class, each twice its
    --mem, scheduled two at a time on the node's 2 CPUs: every task completes verified, each
    its own workflow, and none left a grant behind."""
    out = slurm.jobs / "ens-%a.out"
    job = slurm.sbatch("#!/bin/sh\nexec ./c_matrix 160\n", "--array=0-7", "--mem=96M", "--tm-flags=CAP",
                       f"--output={out}", user="nobody")
    for i in range(8):
        assert slurm.wait(f"{job}_{i}", timeout=600) == "COMPLETED", (slurm.jobs / f"ens-{i}.out").read_text()
        assert "c_matrix: OK" in (slurm.jobs / f"ens-{i}.out").read_text()
    left = [w for w in daemon_status(slurm)["workflows"] if w["name"].startswith(f"slurm-{job}_")]
    assert not left, left


def test_a_report_directory_someone_else_made_is_not_used(slurm):
    """A base directory /tmp/attune-slurm-UID that another user made (here root, mode 0755,
    so the job's user could be shown files it does not own) is refused: the job runs, its
    summary is skipped with a log line, nothing is written there."""
    base = Path("/tmp/attune-slurm-65534")
    if base.exists():
        __import__("shutil").rmtree(base)
    base.mkdir(mode=0o755)
    try:
        p = slurm.run(["srun", "--mem=200M", "--tm-flags=CAP", "./c_matrix", "64"], user="nobody")
        assert p.returncode == 0 and "c_matrix: OK" in p.stdout, p.stdout + p.stderr
        assert list(base.iterdir()) == []
        assert "cannot be this job's private report directory" in (slurm.dir / "slurmd.log").read_text()
    finally:
        base.rmdir()


def test_userfaultfd_device_serves_a_users_async_io():
    """plugstack `userfaultfd=device`: each task gets /dev/userfaultfd, opened as root before
    it becomes the user, so that io_uring reads into its non-resident pages are served where
    vm.unprivileged_userfaultfd=0. Without it (the module's cluster: nobody's userfaultfd sees
    user-mode faults only) the same program runs correctly but untiered, and is told why."""
    if Path("/proc/sys/vm/unprivileged_userfaultfd").read_text().strip() != "0":
        pytest.skip("unprivileged users get kernel faults here anyway")
    s = Slurm()
    try:
        s.write_plugstack(["userfaultfd=device"])
        exe = s.jobs / "async_uring"
        subprocess.run(["gcc", "-O2", "-DUSE_URING", str(ROOT / "tests/run/async_io.c"), "-o", str(exe),
                        "-luring", "-ldl"], check=True)
        p = s.run(["srun", "--mem=200M", "--tm-dram=16M", "sh", "-c",
                   f"echo fd=$ATTUNE_USERFAULTFD_FD; id -un; {exe} {s.jobs} 64"], user="nobody")
        assert p.returncode == 0, p.stdout + p.stderr
        assert "async_io: OK uring 64 MiB" in p.stdout, p.stdout
        assert "nobody" in p.stdout and re.search(r"fd=\d+", p.stdout), p.stdout
        assert "untiered" not in p.stderr, p.stderr
        # Tiered: the 64 MiB buffer went through the far tier, the peak RSS stayed near
        # the 16 MiB budget.
        hwm = int(re.search(r"VmHWM_MiB=(\d+)", p.stdout).group(1))
        assert hwm < 48, p.stdout
    finally:
        s.stop()


def test_without_the_device_async_io_stays_correct_and_untiered(slurm):
    exe = slurm.jobs / "async_uring"
    subprocess.run(["gcc", "-O2", "-DUSE_URING", str(ROOT / "tests/run/async_io.c"), "-o", str(exe),
                    "-luring", "-ldl"], check=True)
    p = slurm.run(["srun", "--mem=200M", "--tm-dram=16M", str(exe), str(slurm.jobs), "64"], user="nobody")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "async_io: OK uring 64 MiB" in p.stdout, p.stdout
    if Path("/proc/sys/vm/unprivileged_userfaultfd").read_text().strip() == "0":
        assert "untiered" in p.stderr and "liburing" in p.stderr, p.stderr
        assert int(re.search(r"VmHWM_MiB=(\d+)", p.stdout).group(1)) >= 64, p.stdout
