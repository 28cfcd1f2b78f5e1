"""Ensembles of IMME's four workflow classes as Slurm job arrays (issue 26, item 5; IMME
Figures 10 and 11 at this machine's scale), side by side in one run.

A real Slurm with emulated nodes (tests/python/slurm_cluster.py: each node a network
namespace with its own slurmd, 2 CPUs and --node-mib of memory; all of them share this
machine's 2 vCPUs), Attune's plugin, and one attuned with a far pool. For each node count
and environment, one array per class (DL, DM, DC, SC of bench/workloads, --per-class
tasks each) is submitted at once:

  IE    --mem of 1.5x the workflow's peak, no Attune
  CBE   --mem of --share x the peak, no Attune: the cluster's kernel, swap not allowed
        to jobs (Slurm's usual AllowedSwapSpace=0): a task over its limit is OOM-killed
  TME   the same --mem, --tm-flags=auto with `mode = "temperature"` (flags ignored)
  IMME  the same --mem, --tm-flags=<the class's flags>

Far pages of TME and IMME go to the node's pool in attuned (the plugin's default with a
daemon), outside the jobs' cgroups. Reported: the makespan (first submission to the last
task's end), tasks completed and verified (each workflow's RESULT line says OK), and each
class's mean task time (GNU time's wall clock). Needs root.

Usage: python3 bench/ensemble.py [--nodes 1,2] [--per-class 4] [--share 0.5]
                                 [--envs IE,CBE,TME,IMME] [--quick] [--plugin-budget]
"""
import argparse
import atexit
import os
import shutil
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "python"))
import imme  # noqa: E402

# Exit status when this machine cannot run it (no Slurm, not root, an installed copy
# without the source tree's test helpers): `attune bench --full` reports it as skipped.
SKIPPED = 77
try:
    from slurm_cluster import Slurm, available  # noqa: E402
    from test_daemon import Daemon  # noqa: E402
except ImportError as e:
    print(f"ensemble.py: skipped: needs the source tree's tests/python ({e})", file=sys.stderr)
    sys.exit(SKIPPED)

CLASSES = ["dl", "dm", "dc", "sc"]
MIB = 1 << 20


def script(prog):
    return "#!/bin/sh\nexec /usr/bin/time -f 'WALL %e' " + " ".join(prog) + "\n"


class Bar:
    """imme.footprint's progress display, silent."""

    def set_description(self, d):
        pass

    def update(self, k=1):
        pass


def submit(s, env, name, w, n, tme_conf, plugin_budget=False):
    """One array of `n` tasks of workflow `name` in environment `env`: its job id, or
    None where Attune has no room under the limit (imme.no_room)."""
    mem = int(w["peak"] * 1.5) if env == "IE" else w["limit"]
    args = [f"--array=0-{n - 1}", f"--mem={max(mem >> 20, 64)}M",
            f"--output={s.jobs}/{env}-{name}-%a.out", f"--job-name={env}-{name}"]
    if env in ("TME", "IMME"):
        # The budget a careful user gives (what bench/imme.py computes): the limit less
        # what the program holds outside Attune; the plugin's default room (10%, at least
        # 32 MiB; --plugin-budget) is less than a Python workflow's interpreter and libraries.
        if not plugin_budget:
            if w["no_room"]:
                return None
            args.append(f"--tm-dram={max(w['budget'] >> 20, 4)}M")
        args += [f"--tm-flags={w['flags']}"] if env == "IMME" else ["--tm-flags=auto", f"--tm-config={tme_conf}"]
    return s.sbatch(script(w["prog"]), *args)


def queued(s, jobs):
    """Tasks of `jobs` still queued or running."""
    if not jobs:
        return 0
    out = s.run(["squeue", "-h", "-r", "-o", "%A", "-j", ",".join(jobs)]).stdout.split()
    return len(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="1,2")
    ap.add_argument("--per-class", type=int, default=4)
    ap.add_argument("--share", type=float, default=0.5)
    ap.add_argument("--envs", default="IE,CBE,TME,IMME")
    ap.add_argument("--node-mib", type=int, default=3072)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--plugin-budget", action="store_true",
                    help="TME and IMME on the plugin's default budget (no --tm-dram)")
    a = ap.parse_args()
    why = available()
    if why:
        print(f"ensemble.py: skipped: {why}", file=sys.stderr)
        sys.exit(SKIPPED)
    envs = a.envs.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="attune-ensemble-"))
    atexit.register(shutil.rmtree, tmp, True)
    os.chmod(tmp, 0o755)
    exes = imme.build(str(tmp))
    work = {}
    for name, title, kind, src, sizes, flags in imme.WORKLOADS:
        if name not in CLASSES:
            continue
        prog = exes[name] + [str(sizes[1] if a.quick else sizes[0])]
        foot, managed, wall, held = imme.footprint(prog, Bar(), name, True)
        limit = int(foot * a.share)
        room = imme.room_at(held, foot, limit)
        work[name] = {"prog": prog, "peak": foot, "flags": flags, "limit": limit,
                      "budget": imme.attune_budget("pool", limit, foot - managed, room),
                      "no_room": imme.no_room("pool", limit, held)}
        print(f"{name}: peak {foot / MIB:.0f} MiB, {held / MIB:.0f} MiB outside Attune, {wall:.2f} s alone; "
              f"limit {limit / MIB:.0f} MiB, Attune's budget {work[name]['budget'] / MIB:.0f} MiB"
              f"{' (no room)' if work[name]['no_room'] else ''}", file=sys.stderr)
    tme_conf = tmp / "tme.toml"
    tme_conf.write_text('mode = "temperature"\n')
    os.chmod(tme_conf, 0o644)
    rows = []
    for nodes in [int(x) for x in a.nodes.split(",")]:
        s = Slurm(nodes=nodes, mem_mib=a.node_mib)
        d = Daemon(s.dir, "--dram", f"{a.node_mib * nodes // 2}M", "--far-pool", "4G",
                   sock=str(s.dir / "attuned.sock"))
        s.write_plugstack([f"socket={d.sock}"])
        try:
            for env in envs:
                t0 = time.monotonic()
                jobs = {n: submit(s, env, n, work[n], a.per_class, tme_conf, a.plugin_budget) for n in CLASSES}
                while queued(s, [j for j in jobs.values() if j]):
                    time.sleep(0.5)
                makespan = time.monotonic() - t0
                per = {}
                why = {}
                ok = 0
                for n in CLASSES:
                    walls = []
                    if not jobs[n]:
                        why[n] = "no room: " + work[n]["no_room"]
                        per[n] = None
                        continue
                    for i in range(a.per_class):
                        f = s.jobs / f"{env}-{n}-{i}.out"
                        text = f.read_text() if f.exists() else ""
                        good = re.search(r"^RESULT \S+ OK ", text, re.M)
                        w = re.search(r"^WALL ([\d.]+)", text, re.M)
                        if good and w:
                            ok += 1
                            walls.append(float(w.group(1)))
                        elif n not in why:
                            why[n] = (text.strip().splitlines() or ["no output"])[-1][:200]
                    per[n] = statistics.mean(walls) if walls else None
                total = a.per_class * len(CLASSES)
                rows.append((nodes, env, total, ok, makespan, per))
                print(f"{nodes} node(s) {env:4s}: {ok}/{total} verified, makespan {makespan:.1f} s, "
                      + ", ".join(f"{n} {v:.2f} s" if v else f"{n} -" for n, v in per.items()), file=sys.stderr)
                for n, w in why.items():
                    print(f"    {n}: a task failed: {w}", file=sys.stderr)
        finally:
            d.stop()
            s.stop()
    ie = {nodes: m for nodes, e, _, _, m, _ in rows if e == "IE"}
    print(f"\nEnsembles of {a.per_class} tasks per class ({'quick' if a.quick else 'full'} sizes), "
          f"DRAM --share {a.share} of each workflow's peak (IE: 1.5x); emulated nodes of 2 CPUs and "
          f"{a.node_mib} MiB sharing this machine's 2 vCPUs.\n")
    print("| nodes | env | verified | makespan (s) | vs IE | " + " | ".join(f"{n.upper()} mean (s)" for n in CLASSES)
          + " |")
    print("|---|---|---|---|---|" + "---|" * len(CLASSES))
    for nodes, env, total, ok, m, per in rows:
        # A time only where every task was verified: an ensemble that lost tasks ended early.
        ratio = f"{m / ie[nodes]:.2f}x" if nodes in ie and ok == total else "-"
        cells = " | ".join(f"{per[n]:.2f}" if per[n] else "-" for n in CLASSES)
        print(f"| {nodes} | {env} | {ok}/{total} | {m:.1f} | {ratio} | {cells} |")


if __name__ == "__main__":
    main()
