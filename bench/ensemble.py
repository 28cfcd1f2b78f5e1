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

With several shares (`--share 0.3,0.5,0.7`), CBE, TME and IMME run at each and a second
table gives each class's mean task time over its IE time by share: IMME's Figure 8 at this
machine's scale (`--plot PATH` draws it).

Usage: python3 bench/ensemble.py [--nodes 1,2] [--per-class 4] [--share 0.5[,0.7...]]
                                 [--envs IE,CBE,TME,IMME] [--quick] [--plugin-budget]
                                 [--plot PATH]
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


def at_share(measured, share):
    """Each class's limit, Attune's budget and whether it has room, at `share` of its peak."""
    work = {}
    for name, (prog, flags, foot, managed, held) in measured.items():
        limit = int(foot * share)
        room = imme.room_at(held, foot, limit)
        work[name] = {"prog": prog, "peak": foot, "flags": flags, "limit": limit,
                      "budget": imme.attune_budget("pool", limit, foot - managed, room),
                      "no_room": imme.no_room("pool", limit, held)}
        print(f"{name} at {share:g} of its peak: limit {limit / MIB:.0f} MiB, Attune's budget "
              f"{work[name]['budget'] / MIB:.0f} MiB{' (no room)' if work[name]['no_room'] else ''}",
              file=sys.stderr)
    return work


def parse_shares(text):
    """`--share`: one share of the peak or several, comma-separated, each in (0, 1.5]."""
    try:
        shares = [float(x) for x in text.split(",")]
    except ValueError:
        shares = []
    if not shares or any(not 0 < x <= 1.5 for x in shares) or len(set(shares)) != len(shares):
        raise argparse.ArgumentTypeError(
            f"shares of the peak in (0, 1.5], comma-separated, each once: {text!r}")
    return sorted(shares)


def cell(per, n, total):
    """A class's mean task time, and how many of its tasks were verified when not all."""
    walls = per[n]
    if not walls:
        return "-"
    return f"{statistics.mean(walls):.2f}" + ("" if len(walls) == total else f" ({len(walls)}/{total})")


def figure8(rows, shares, per_class):
    """Each class's mean task time over its IE time (same node count), by share: rows of
    (nodes, class, env, {share: ratio or None})."""
    ie = {(nodes, n): statistics.mean(per[n]) for nodes, _, env, _, _, _, per in rows
          if env == "IE" for n in CLASSES if per[n]}
    out = []
    for nodes in sorted({r[0] for r in rows}):
        for n in CLASSES:
            for env in [e for e in ("CBE", "TME", "IMME") if any(r[2] == e for r in rows)]:
                ratios = {}
                for rn, share, renv, _, _, _, per in rows:
                    if (rn, renv) == (nodes, env) and (nodes, n) in ie:
                        # A ratio only where every task of the class was verified.
                        ok = per[n] and len(per[n]) == per_class
                        ratios[share] = statistics.mean(per[n]) / ie[(nodes, n)] if ok else None
                out.append((nodes, n, env, ratios))
    return out


def plot(fig8, shares, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    nodes = sorted({r[0] for r in fig8})[0]
    fig, axes = plt.subplots(1, len(CLASSES), figsize=(3.2 * len(CLASSES), 3))
    for ax, n in zip(axes, CLASSES):
        for _, _, env, ratios in [r for r in fig8 if r[0] == nodes and r[1] == n]:
            xs = [sh for sh in shares if ratios.get(sh) is not None]
            if xs:
                ax.plot([100 * x for x in xs], [ratios[x] for x in xs], marker="o", label=env)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(n.upper())
        ax.set_xlabel("DRAM, % of peak")
    axes[0].set_ylabel("mean task time / IE")
    axes[-1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="1,2")
    ap.add_argument("--per-class", type=int, default=4)
    ap.add_argument("--share", type=parse_shares, default=[0.5],
                    help="DRAM (--mem) of CBE, TME and IMME as a share of each workflow's peak; "
                    "several, comma-separated, sweep it (Figure 8)")
    ap.add_argument("--envs", default="IE,CBE,TME,IMME")
    ap.add_argument("--node-mib", type=int, default=3072)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--plugin-budget", action="store_true",
                    help="TME and IMME on the plugin's default budget (no --tm-dram)")
    ap.add_argument("--plot", help="draw the Figure 8 table (first node count) into this PNG")
    a = ap.parse_args()
    shares = a.share
    why = available()
    if why:
        print(f"ensemble.py: skipped: {why}", file=sys.stderr)
        sys.exit(SKIPPED)
    envs = a.envs.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="attune-ensemble-"))
    atexit.register(shutil.rmtree, tmp, True)
    os.chmod(tmp, 0o755)
    exes = imme.build(str(tmp))
    measured = {}
    for name, title, kind, src, sizes, flags in imme.WORKLOADS:
        if name not in CLASSES:
            continue
        prog = exes[name] + [str(sizes[1] if a.quick else sizes[0])]
        foot, managed, wall, held = imme.footprint(prog, Bar(), name, True)
        measured[name] = (prog, flags, foot, managed, held)
        print(f"{name}: peak {foot / MIB:.0f} MiB, {held / MIB:.0f} MiB outside Attune, {wall:.2f} s alone",
              file=sys.stderr)
    work = {share: at_share(measured, share) for share in shares}
    tme_conf = tmp / "tme.toml"
    tme_conf.write_text('mode = "temperature"\n')
    os.chmod(tme_conf, 0o644)
    # IE does not depend on the share (its --mem is 1.5x the peak): it runs once per node
    # count. The others run share by share, environments alternated within each share.
    runs = [("IE", None)] if "IE" in envs else []
    runs += [(e, sh) for sh in shares for e in envs if e != "IE"]
    rows = []
    for nodes in [int(x) for x in a.nodes.split(",")]:
        s = Slurm(nodes=nodes, mem_mib=a.node_mib)
        d = Daemon(s.dir, "--dram", f"{a.node_mib * nodes // 2}M", "--far-pool", "4G",
                   sock=str(s.dir / "attuned.sock"))
        s.write_plugstack([f"socket={d.sock}"])
        try:
            for env, share in runs:
                w = work[share if share is not None else shares[0]]
                t0 = time.monotonic()
                jobs = {n: submit(s, env, n, w[n], a.per_class, tme_conf, a.plugin_budget) for n in CLASSES}
                while queued(s, [j for j in jobs.values() if j]):
                    time.sleep(0.5)
                makespan = time.monotonic() - t0
                per = {}
                why = {}
                ok = 0
                for n in CLASSES:
                    walls = []
                    if not jobs[n]:
                        why[n] = "no room: " + w[n]["no_room"]
                        per[n] = []
                        continue
                    for i in range(a.per_class):
                        f = s.jobs / f"{env}-{n}-{i}.out"
                        text = f.read_text() if f.exists() else ""
                        good = re.search(r"^RESULT \S+ OK ", text, re.M)
                        wall = re.search(r"^WALL ([\d.]+)", text, re.M)
                        if good and wall:
                            ok += 1
                            walls.append(float(wall.group(1)))
                        elif n not in why:
                            why[n] = (text.strip().splitlines() or ["no output"])[-1][:200]
                        # The next run of the same array name writes the same files.
                        if f.exists():
                            f.unlink()
                    per[n] = walls
                total = a.per_class * len(CLASSES)
                rows.append((nodes, share, env, total, ok, makespan, per))
                print(f"{nodes} node(s) {env:4s} {'' if share is None else f'at {share:g} '}: {ok}/{total} "
                      f"verified, makespan {makespan:.1f} s, "
                      + ", ".join(f"{n} {statistics.mean(v):.2f} s" if v else f"{n} -" for n, v in per.items()),
                      file=sys.stderr)
                for n, why_n in why.items():
                    print(f"    {n}: a task failed: {why_n}", file=sys.stderr)
        finally:
            d.stop()
            s.stop()
    ie = {nodes: m for nodes, _, e, _, _, m, _ in rows if e == "IE"}
    print(f"\nEnsembles of {a.per_class} tasks per class ({'quick' if a.quick else 'full'} sizes); "
          f"--mem of each workflow: the share of its peak shown (IE: 1.5x its peak); emulated nodes of "
          f"2 CPUs and {a.node_mib} MiB sharing this machine's 2 vCPUs.\n")
    print("| nodes | share | env | verified | makespan (s) | vs IE | "
          + " | ".join(f"{n.upper()} mean (s)" for n in CLASSES) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(CLASSES))
    for nodes, share, env, total, ok, m, per in rows:
        # A time only where every task was verified: an ensemble that lost tasks ended early.
        ratio = f"{m / ie[nodes]:.2f}x" if nodes in ie and ok == total else "-"
        cells = " | ".join(cell(per, n, a.per_class) for n in CLASSES)
        sh = "-" if share is None else f"{share:g}"
        print(f"| {nodes} | {sh} | {env} | {ok}/{total} | {m:.1f} | {ratio} | {cells} |")
    if "IE" in envs and len(shares) > 1:
        fig8 = figure8(rows, shares, a.per_class)
        print("\nFigure 8: each class's mean task time over its IE time, by DRAM share of its peak "
              "(-: not every task verified, or no room under the limit)\n")
        print("| nodes | class | env | " + " | ".join(f"{x:g}" for x in shares) + " |")
        print("|---|---|---|" + "---|" * len(shares))
        for nodes, n, env, ratios in fig8:
            cells = " | ".join(f"{ratios[x]:.2f}" if ratios.get(x) is not None else "-" for x in shares)
            print(f"| {nodes} | {n.upper()} | {env} | {cells} |")
        if a.plot:
            plot(fig8, shares, a.plot)


if __name__ == "__main__":
    main()
