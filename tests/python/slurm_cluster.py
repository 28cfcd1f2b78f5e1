"""A real single-node Slurm for tests and benchmarks (../shared/notes/slurm-containers.md):
its own munged, slurmctld and slurmd on private ports, sockets, state and log files in one
directory, Attune's SPANK plugin in its plugstack, cgroup v1 memory limits; with
`accounting=True` also slurmdbd on a private MariaDB (sacct). Stopped by the PIDs it
started; the job cgroups Slurm leaves behind are removed.

    with Slurm(plugin_args=["socket=/tmp/x.sock"]) as s:
        s.run(["srun", "--mem=200M", "--tm-flags=CAP", "./prog"])
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
PLUGIN = BUILD / "lib" / "slurm" / "spank_attune.so"
PRELOAD = BUILD / "lib" / "libattune_preload.so"
CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def available():
    """Why a Slurm cannot be started here, or None."""
    if os.geteuid() != 0:
        return "needs root (slurmd)"
    for tool in ("munged", "slurmctld", "slurmd", "srun"):
        if not shutil.which(tool):
            return f"{tool} is not installed (scripts/setup.sh)"
    if not PLUGIN.exists():
        return "make build first (the SPANK plugin needs libslurm-dev)"
    if not (CGROUP_V1 / "memory.limit_in_bytes").exists():
        return "needs the cgroup v1 memory controller"
    return None


def accounting_available():
    """Why job accounting (slurmdbd on a private MariaDB) cannot run here, or None."""
    for tool in ("slurmdbd", "mariadbd", "mariadb-install-db", "mariadb", "sacct"):
        if not shutil.which(tool):
            return f"{tool} is not installed (scripts/setup.sh)"
    return None


def sh(*argv):
    subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True)


def gone(pid):
    """Whether process `pid` has ended: no such process, or a zombie (MariaDB is this
    process's child and stays one until `wait`: waiting for it to vanish cost every
    teardown the 5 s before its SIGKILL)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


class Slurm:
    def __init__(self, plugin_args=(), cpus=2, mem_mib=16000, accounting=False, nodes=1):
        """`accounting`: also a private MariaDB and slurmdbd, so that sacct answers and
        keeps the jobs' comments (AccountingStoreFlags=job_comment). `nodes` above 1:
        a cluster of emulated nodes, each a network namespace with its own slurmd and
        node name (cgroups `slurm_NAME`), the controller (and the client commands of
        `run`) in one more, all on one bridge; they share this machine's file systems,
        CPUs and memory."""
        self.accounting = accounting
        self.db_proc = None
        self.netns = []
        self.dir = Path(tempfile.mkdtemp(prefix="attune-slurmtest-"))
        os.chmod(self.dir, 0o755)
        self.jobs = self.dir / "jobs"
        self.jobs.mkdir()
        os.chmod(self.jobs, 0o1777)
        self.pids = []
        port = random.randrange(20000, 60000, 2)
        self.cluster = f"at{os.getpid() % 100000}"
        d = self.dir
        (d / "state").mkdir()
        (d / "spool").mkdir()
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        self.munge_sock = d / "munge.sock"
        self.multi = nodes > 1
        if self.multi:
            self.nodes = [f"{self.cluster}n{i}" for i in range(1, nodes + 1)]
            net = f"127.79.{os.getpid() % 250}"
            ctl_host = f"{socket.gethostname().split('.')[0]}({net}.1)"
            node_lines = "\n".join(f"NodeName={n} NodeAddr={net}.{i + 2} CPUs={cpus} RealMemory={mem_mib}"
                                    for i, n in enumerate(self.nodes))
            suffix = "-%n"
        else:
            self.nodes = ["localhost"]
            ctl_host = "localhost"
            node_lines = f"NodeName=localhost CPUs={cpus} RealMemory={mem_mib}"
            suffix = ""
        (d / "slurm.conf").write_text(f"""ClusterName={self.cluster}
SlurmctldHost={ctl_host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_sock}
CredType=cred/munge
MpiDefault=none
SlurmctldPort={port}
SlurmdPort={port + 1}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/{"%n" if self.multi else ""}
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd{suffix}.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd{suffix}.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
PlugStackConfig={d}/plugstack.conf
MailProg=/bin/true
ReturnToService=2
SchedulerParameters=sched_interval=1
{node_lines}
PartitionName=debug Nodes={",".join(self.nodes)} Default=YES State=UP MaxTime=INFINITE
""")
        if accounting:
            self.db_port = port + 2
            self.dbd_port = port + 3
            with open(d / "slurm.conf", "a") as f:
                f.write(f"""AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={self.dbd_port}
AccountingStoreFlags=job_comment
AccountingStoragePass={self.munge_sock}
JobAcctGatherType=jobacct_gather/none
""")
            conf = d / "slurmdbd.conf"
            conf.write_text(f"""AuthType=auth/munge
AuthInfo=socket={self.munge_sock}
DbdHost=localhost
DbdPort={self.dbd_port}
SlurmUser=root
PidFile={d}/slurmdbd.pid
LogFile={d}/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.db_port}
StorageUser=slurm
StoragePass=attune-test
StorageLoc=slurm_acct_{self.cluster}
""")
            os.chmod(conf, 0o600)
        (d / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nConstrainRAMSpace=yes\nConstrainSwapSpace=yes\nAllowedSwapSpace=0\n")
        self.write_plugstack(plugin_args)
        # Jobs inherit the submitter's environment (--export=ALL): none of the caller's
        # Attune settings may reach them, only what the plugin sets.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTUNE_", "TM_"))
                    and k != "LD_PRELOAD"}
        self.env["SLURM_CONF"] = str(d / "slurm.conf")
        try:
            if self.multi:
                self._network(net)
                for n in self.nodes:
                    (d / "spool" / n).mkdir()
            self._start()
        except Exception:
            self.stop()
            raise

    def write_plugstack(self, plugin_args=(), reconfigure=False):
        args = [f"preload={PRELOAD}", *plugin_args]
        (self.dir / "plugstack.conf").write_text(f"required {PLUGIN} {' '.join(args)}\n")

    def _network(self, net):
        """The controller's and each node's namespace, on one bridge: the controller at
        NET.1, node i at NET.i+2 (127.x: a per-namespace setting allows them on a wire)."""
        tag = self.cluster
        switch = f"{tag}sw"
        sh("ip", "netns", "add", switch)
        self.netns.append(switch)
        sh("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", switch, "link", "set", "br0", "up")
        for i, name in enumerate(["ctl", *self.nodes], 1):
            ns = f"{tag}{name}" if name == "ctl" else name
            a, b = f"{tag}h{i}", f"{tag}p{i}"
            sh("ip", "netns", "add", ns)
            self.netns.append(ns)
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            sh("ip", "link", "set", a, "netns", ns)
            sh("ip", "link", "set", b, "netns", switch)
            sh("ip", "-n", switch, "link", "set", b, "master", "br0")
            sh("ip", "-n", switch, "link", "set", b, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "link", "set", a, "up")
            sh("ip", "netns", "exec", ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/conf/all/route_localnet && "
               f"echo 1 > /proc/sys/net/ipv4/conf/{a}/route_localnet")
            sh("ip", "-n", ns, "addr", "add", f"{net}.{i}/32", "dev", a)
            sh("ip", "-n", ns, "route", "add", f"{net}.0/24", "dev", a)
        self.ctl_ns = f"{tag}ctl"

    def on(self, ns):
        """The prefix that runs a command in namespace `ns`'s network only (`ip netns
        exec` would also mount a /sys of its own, hiding the cgroups slurmd needs)."""
        return ["nsenter", f"--net=/run/netns/{ns}"] if self.multi else []

    def _start(self):
        d = self.dir
        subprocess.run(["munged", f"--socket={self.munge_sock}", f"--key-file={d}/munge.key",
                        f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                        f"--seed-file={d}/munged.seed"], check=True, capture_output=True)
        self.pids.append(int((d / "munged.pid").read_text()))
        if self.accounting:
            self._start_accounting()
        conf = str(d / "slurm.conf")
        if not self.multi:
            for daemon in ("slurmctld", "slurmd"):
                subprocess.run([daemon, "-f", conf], check=True, capture_output=True, env=self.env)
                self.pids.append(self._pid(daemon))
        else:
            subprocess.run([*self.on(self.ctl_ns), "slurmctld", "-f", conf], check=True,
                           capture_output=True, env=self.env)
            self.pids.append(self._pid("slurmctld"))
            for n in self.nodes:
                subprocess.run([*self.on(n), "slurmd", "-f", conf, "-N", n], check=True,
                               capture_output=True, env=self.env)
                self.pids.append(self._pid(f"slurmd-{n}"))
        for _ in range(300):
            p = self.run(["sinfo", "-h", "-N", "-o", "%t"], timeout=30)
            if p.stdout.split() == ["idle"] * len(self.nodes):
                return
            time.sleep(0.1)
        logs = sorted(d.glob("slurm*.log"))
        raise RuntimeError("slurmd did not come up: " + " ".join(p.read_text()[-1000:] for p in logs))

    def _start_accounting(self):
        """A private MariaDB (its own data directory and port, root only through its
        socket) and slurmdbd on it."""
        d = self.dir
        db = d / "db"
        subprocess.run(["mariadb-install-db", f"--datadir={db}", "--user=root",
                        "--auth-root-authentication-method=socket", "--skip-test-db"],
                       check=True, capture_output=True)
        sock = d / "mariadb.sock"
        ctl = self.on(self.ctl_ns) if self.multi else []
        self.db_proc = subprocess.Popen([*ctl, "mariadbd", "--no-defaults", f"--datadir={db}", f"--socket={sock}",
                          f"--port={self.db_port}", "--bind-address=127.0.0.1", "--user=root",
                          f"--pid-file={d}/mariadb.pid", f"--log-error={d}/mariadb.log",
                          "--skip-name-resolve"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pids.append(self._pid("mariadb"))
        sql = ("CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'attune-test'; "
               f"GRANT ALL ON slurm_acct_{self.cluster}.* TO 'slurm'@'127.0.0.1';")
        for _ in range(100):
            if subprocess.run(["mariadb", "--no-defaults", "-S", str(sock), "-u", "root", "-e", sql],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("mariadb did not come up: " + (d / "mariadb.log").read_text()[-2000:])
        # slurmdbd reads the slurmdbd.conf beside $SLURM_CONF (it has no -f).
        subprocess.run([*ctl, "slurmdbd"], check=True, capture_output=True, env=self.env)
        self.pids.append(self._pid("slurmdbd"))
        # slurmctld registers its cluster with slurmdbd only once slurmdbd answers.
        deadline = time.time() + 20
        while time.time() < deadline:
            if subprocess.run([*ctl, "sacctmgr", "-n", "list", "cluster"], capture_output=True,
                              env=self.env, timeout=20).returncode == 0:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("slurmdbd did not come up: " + (d / "slurmdbd.log").read_text()[-2000:])

    def _pid(self, daemon):
        f = self.dir / f"{daemon}.pid"
        for _ in range(100):
            if f.exists() and f.read_text().strip():
                return int(f.read_text())
            time.sleep(0.05)
        raise RuntimeError(f"{daemon} did not start: " + (self.dir / f"{daemon}.log").read_text()[-2000:])

    def run(self, argv, user=None, timeout=300, **kw):
        """Runs a Slurm client command (as `user` if given) in the jobs directory."""
        argv = [str(a) for a in argv]
        if user:
            argv = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={self.env['SLURM_CONF']}", *argv]
        if self.multi:
            argv = [*self.on(self.ctl_ns), *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env,
                              cwd=self.jobs, **kw)

    def sbatch(self, script, *args, user=None):
        """Submits `script` (text); returns the job id."""
        path = self.jobs / f"job{random.randrange(1 << 30)}.sh"
        path.write_text(script)
        os.chmod(path, 0o755)
        p = self.run(["sbatch", "--parsable", *args, path], user=user)
        if p.returncode != 0:
            raise RuntimeError(f"sbatch failed ({p.returncode}): {p.stderr}")
        return p.stdout.strip().split(";")[0]

    def wait(self, job, timeout=300):
        """Waits until the job has left the queue; returns its state as sacct-less Slurm
        keeps it (scontrol show job) or "GONE"."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            st = self.state(job)
            if st not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
                return st
            time.sleep(0.2)
        raise TimeoutError(f"job {job} still {self.state(job)}")

    def state(self, job):
        p = self.run(["scontrol", "-o", "show", "job", job])
        for f in p.stdout.split():
            if f.startswith("JobState="):
                return f.split("=", 1)[1]
        return "GONE"

    def show(self, job):
        p = self.run(["scontrol", "-o", "show", "job", job])
        return dict(f.split("=", 1) for f in p.stdout.split() if "=" in f)

    def stop(self):
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                if gone(pid):
                    break
                time.sleep(0.05)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.pids = []
        if self.db_proc:
            self.db_proc.wait(timeout=30)
        # A step whose job was not ended (a failed test) keeps its slurmstepd: every process
        # left in the job cgroups of our slurmd is ours to end.
        for n in self.nodes:
            for procs in Path("/sys/fs/cgroup").glob(f"*/slurm_{n}/**/cgroup.procs"):
                for pid in procs.read_text().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
        time.sleep(0.2)
        for ns in self.netns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.netns = []
        # slurmd leaves empty job cgroups behind: remove them, deepest first.
        for ctrl, n in ((c, n) for c in Path("/sys/fs/cgroup").iterdir() for n in self.nodes):
            top = ctrl / f"slurm_{n}"
            if top.is_dir():
                for sub in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
                    if sub.is_dir():
                        try:
                            sub.rmdir()
                        except OSError:
                            pass
                try:
                    top.rmdir()
                except OSError:
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)
        # The plugin's per-user report directories, once their jobs' epilogs emptied them.
        for d in Path("/tmp").glob("attune-slurm-*"):
            try:
                d.rmdir()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
