#!/usr/bin/env python3
"""IMME's Figure 7 on this machine: co-located workflows of the four classes share one
node's DRAM, divided by three allocation policies on the same mechanism (Attune's runtime,
its memory tier as the far memory), and by the kernel for reference.

  python3 bench/fig7.py [--reps 2] [--outside 0.25] [--workloads dm,sc,stream,dc]
                        [--policies default,uniform,attuned,kernel] [--out results] [--update-docs]

The node's DRAM is (1 - outside) times the workflows' footprints added up (each footprint
is its peak RSS alone, as in bench/imme.py); all workflows start at once and share it:
  default  attuned divides the node's DRAM by demand alone: every runtime in temperature-
           only mode without flags (one weight for all, water-filling by what each wants),
           as a kernel that gives memory to whoever asks, regardless of the workflow's class;
  uniform  no arbitration: every workflow holds the same share of its own footprint in
           DRAM (1 - outside) and the rest in the far tier, temperature-only: far memory
           spread evenly over the workflows (the paper's uniform interleave);
  attuned  attuned with each workflow's flags (IMME Table I classes): LAT/SHL protected
           bytes first, weighted water-filling, attuned placement and replacement;
  kernel   (reference; root) plain memory, all workflows in one cgroup limited to the
           node's DRAM with kernel swap on a memory medium (`attune kernel-swap`);
  pool     (root) attuned with flags as `attuned`, the far tier the node's pool held by
           attuned (`kind = "pool"`), and every workflow inside a cgroup at the same
           limit as `kernel`, without kernel swap: the far memory outside the jobs for
           both (the kernel's swap device, attuned's pool), so the two are measured
           alike; attuned divides the limit less each workflow's room (its part outside
           Attune under `attune run`, measured alone, and 4 MiB).
Attune's budgets cover the memory it manages; each workflow's unmanaged part (interpreter,
small objects, measured alone) is subtracted from the node's DRAM, as bench/imme.py does
per workflow, so every policy holds the same total.

Each workflow's wall time is normalized to its time alone with all the memory it wants
(IE); the policies run in interleaved rounds; medians of --reps rounds. Every run's
result is checked (a workflow's RESULT line says OK) before it counts.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import imme  # noqa: E402  (workloads, footprint measurement, runner)

ATTUNED = imme.ATTUNED
POLICIES = ["default", "uniform", "attuned", "kernel", "pool"]
DEFAULT_MIX = "dm,sc,stream,dc"


def group(cmds, envs):
    """Starts every command at once; returns per command its wall time from the common
    start, its RESULT line and whether it is OK."""
    t0 = time.perf_counter()
    procs = []
    for cmd, env in zip(cmds, envs):
        fo = tempfile.TemporaryFile()
        fe = tempfile.TemporaryFile()
        procs.append((subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env), fo, fe))
    left = {p.pid: i for i, (p, _, _) in enumerate(procs)}
    walls = [0.0] * len(procs)
    codes = [0] * len(procs)
    while left:
        # Each of ours by pid (never another child, such as the daemon), polled every 5 ms.
        for pid in list(left):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                i = left.pop(pid)
                walls[i] = time.perf_counter() - t0
                codes[i] = os.waitstatus_to_exitcode(status)
                procs[i][0].returncode = codes[i]
        time.sleep(0.005)
    out = []
    for i, (p, fo, fe) in enumerate(procs):
        fo.seek(0)
        fe.seek(0)
        so, se = fo.read().decode(), fe.read().decode()
        line = next((l for l in so.splitlines() if l.startswith("RESULT ")), "")
        out.append({"wall": walls[i], "exit": codes[i], "result": line,
                    "ok": codes[i] == 0 and " OK " in line, "stderr": se[-1500:]})
    return out


def pool_policy_dram(sel, node):
    """What attuned divides under the pool policy: the node's limit less every workflow's
    room (its held part and slack, bench/imme.py `room_at`), and 1/64 of what goes far."""
    held = sum(w["held"] + imme.ROOM_SLACK for w in sel) - imme.ROOM_SLACK
    return node - imme.room_at(held, sum(w["footprint"] for w in sel), node)


def policy_run(policy, sel, tmp, node, pool, bw_dram_share, move_limit, report_dir=None):
    """One co-located run of the selected workflows under `policy`; with `report_dir`,
    each `attune run` writes its run report there (POLICY-WORKFLOW-NS.json)."""
    cmds, envs = [], []
    far_pool = sum(w["footprint"] for w in sel) if policy == "pool" else None
    if policy == "pool":
        # In the node's cgroup, each runtime's ceiling is the limit less the room of all
        # the workflows' parts outside Attune (measured alone, as bench/imme.py does).
        pool = pool_policy_dram(sel, node)
    daemon = (imme.Daemon(tmp, dram=pool, far_pool=far_pool, move_limit=move_limit,
                          bw_dram_share=bw_dram_share, sample=True)
              if policy in ("default", "attuned", "pool") else None)
    grants = {}
    try:
        for w in sel:
            env = dict(os.environ, ATTUNE_WORKFLOW=f"fig7-{w['name']}")
            if policy == "kernel":
                cmds.append(w["prog"])
            else:
                if policy == "uniform":
                    dram = w["managed_budget"]
                    env["ATTUNE_DAEMON"] = "off"
                else:
                    # The runtime's own ceiling is the whole pool; the daemon's grant rules.
                    dram = pool
                    env.update(ATTUNE_SOCKET=daemon.sock, ATTUNE_DAEMON="require")
                if policy == "pool":
                    env["ATTUNE_CONFIG"] = imme.pool_config(tmp)
                    env["ATTUNE_LIMIT_ROOM"] = imme.mb(node - pool)
                cmd = [imme.ATT, "run", "-q", "--dram", imme.mb(dram)]
                if report_dir:
                    cmd += ["--report", os.path.join(report_dir, f"{policy}-{w['name']}-{time.time_ns()}.json")]
                if policy != "pool":
                    cmd += ["--far", imme.EMULATED]   # the pool policy's file names its tiers
                if policy in ("attuned", "pool"):
                    cmd += ["--flags", w["flags"]]
                else:
                    env["ATTUNE_MODE"] = "temperature"
                cmds.append(cmd + ["--"] + w["prog"])
            envs.append(env)
        if policy in ("kernel", "pool"):
            spec = os.path.join(tmp, "group.json")
            res = os.path.join(tmp, "group-out.json")
            if os.path.exists(res):
                os.unlink(res)      # an earlier round's; never read it as this one's
            with open(spec, "w") as f:
                json.dump({"cmds": cmds, "envs": envs if policy == "pool" else None}, f)
            # The kernel's far memory is its swap device; the pool policy's is attuned's
            # pool, and the kernel swaps none of its pages (swappiness 0).
            swap = "memory" if policy == "kernel" else "none"
            r = subprocess.run([imme.ATT, "kernel-swap", "--limit", imme.mb(node), "--swap", swap,
                                "--swap-size", "4G", "--", sys.executable, os.path.abspath(__file__),
                                "--group", spec, res], capture_output=True, text=True)
            if r.returncode != 0 or not os.path.exists(res):
                return [{"wall": float("nan"), "ok": False, "exit": r.returncode, "result": "",
                         "stderr": r.stderr[-1500:]} for _ in sel]
            with open(res) as f:
                out = json.load(f)
        else:
            out = group(cmds, envs)
    finally:
        if daemon:
            grants = daemon.stop()
    for w, r in zip(sel, out):
        r["grant"] = grants.get(f"fig7-{w['name']}")
    return out


def markdown(res, cmdline):
    pols = res["policies"]
    lines = [f"Reproduce: `{cmdline}` ({res['date']}, {res['reps']} rounds, median; node DRAM "
             f"{res['node_mib']} MiB = {100 - int(res['outside'] * 100)}% of the workflows' footprints added up, "
             f"Attune's pool {res['pool_mib']} MiB after their unmanaged parts"
             + (f" ({res['pool_policy_mib']} MiB for the pool policy: its cgroup's limit less their rooms)"
                if "pool" in pols and res.get("pool_policy_mib") else "")
             + "; a BW workflow claims "
             f"{res.get('bw_dram_share', 100)}% of its want in DRAM, DRAM's share of a DRAM+CXL node's bandwidth). "
             "Wall time of each workflow "
             "started together with the others, normalized to its time alone with all the memory it wants (IE).",
             "", "| workflow | flags | footprint | IE alone (s) | " + " | ".join(pols) + " |",
             "|---|---|---|---|" + "---|" * len(pols)]
    for w in res["workflows"]:
        cells = []
        for p in pols:
            x = w["policies"].get(p)
            if not x:
                cells.append("-")
            elif not x["ok"]:
                cells.append("FAILED")
            else:
                cells.append(f"{x['normalized']:.2f} ({x['min'] / w['ie']:.2f}-{x['max'] / w['ie']:.2f})")
        lines.append(f"| {w['title']} | {w['flags']} | {w['footprint'] >> 20} MiB | {w['ie']:.2f} | " + " | ".join(cells) + " |")
    tot = []
    for p in pols:
        t = res["totals"].get(p)
        tot.append("-" if t is None else f"**{t:.2f}**")
    lines.append("| **all (sum of times / sum of IE times)** | | | | " + " | ".join(tot) + " |")
    dram_pols = [p for p in pols if p != "kernel"]
    if dram_pols:
        lines += ["", "DRAM each workflow's managed memory was given (MiB; default, attuned and pool: median of the "
                  "daemon's grants sampled every 0.1 s; uniform: its fixed budget):", "",
                  "| workflow | " + " | ".join(dram_pols) + " |", "|---|" + "---|" * len(dram_pols)]
        for w in res["workflows"]:
            cells = []
            for p in dram_pols:
                d = w["policies"].get(p, {}).get("dram")
                cells.append("-" if d is None else f"{int(d) >> 20}")
            lines.append(f"| {w['name']} ({w['flags']}) | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines) + "\n"


def plot(res, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    pols = res["policies"]
    names = [w["name"] for w in res["workflows"]] + ["all"]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    width = 0.8 / len(pols)
    for k, p in enumerate(pols):
        vals = [w["policies"].get(p, {}).get("normalized", float("nan")) for w in res["workflows"]]
        vals.append(res["totals"].get(p) or float("nan"))
        ax.bar([i + k * width for i in range(len(names))], vals, width, label=p)
    ax.set_xticks([i + width * (len(pols) - 1) / 2 for i in range(len(names))])
    ax.set_xticklabels(names)
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_ylabel("time / IE alone")
    ax.set_title("Figure 7 on this machine: co-located workflows, DRAM by policy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    made = []
    for ext in ("png", "svg"):
        p = os.path.join(out, f"imme-fig7.{ext}")
        fig.savefig(p, dpi=120)
        made.append(p)
    plt.close(fig)
    return made


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--group":
        # Inside `attune kernel-swap`: run the commands together in its cgroup.
        with open(sys.argv[2]) as f:
            spec = json.load(f)
        cmds = spec["cmds"]
        with open(sys.argv[3], "w") as f:
            json.dump(group(cmds, spec.get("envs") or [None] * len(cmds)), f)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--outside", type=float, default=0.25)
    ap.add_argument("--workloads", default=DEFAULT_MIX)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--quick", action="store_true", help="small sizes (tests)")
    ap.add_argument("--out", default=os.path.join(imme.ROOT, "results"))
    ap.add_argument("--update-docs", action="store_true")
    ap.add_argument("--report-dir", help="each attune run writes its run report here (budget lowerings, "
                    "what each runtime saw outside: docs/run-report.md)")
    # The far memory modelled is CXL: the QEMU guest's HMAT figures, 100 GB/s of DRAM
    # beside 30 GB/s of CXL, give DRAM 77% of the node's bandwidth (attuned's
    # --bw-dram-share: a BW workflow claims that part of its want in DRAM).
    ap.add_argument("--bw-dram-share", type=int, default=77)
    # attuned's pacing of non-LAT/SHL workflows' page movement while a LAT/SHL one runs.
    ap.add_argument("--move-limit", default="1G")
    a = ap.parse_args()
    if a.report_dir:
        os.makedirs(a.report_dir, exist_ok=True)
    if not 1 <= a.bw_dram_share <= 100:
        sys.exit("--bw-dram-share is a percentage from 1 to 100")
    if not 0 < a.outside < 1:
        sys.exit("--outside must be between 0 and 1")
    if a.reps < 1:
        sys.exit("--reps must be at least 1")
    for x in (imme.ATT, ATTUNED):
        if not os.path.exists(x):
            sys.exit(f"{x} not found: run `make build` first")
    pols = [p for p in a.policies.split(",") if p]
    bad = [p for p in pols if p not in POLICIES]
    if bad:
        sys.exit(f"unknown policy {','.join(bad)} (one of {','.join(POLICIES)})")
    if "kernel" in pols or "pool" in pols:
        chk = subprocess.run([imme.ATT, "kernel-swap", "--check"], capture_output=True, text=True)
        if chk.returncode != 0:
            why = chk.stdout.strip() or chk.stderr.strip()
            for p in ("kernel", "pool"):
                if p in pols:
                    print(f"{p} policy skipped (it runs in kernel-swap's cgroup): {why}", file=sys.stderr)
                    pols.remove(p)
    names = [n for n in a.workloads.split(",") if n]
    known = {w[0]: w for w in imme.WORKLOADS}
    unknown = [n for n in names if n not in known]
    if unknown or len(names) < 2:
        sys.exit(f"--workloads: two or more of {','.join(known)} (got {a.workloads})")
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="attune-fig7-")
    exes = imme.build(tmp)
    bar = imme.progress(len(names) * 2 + a.reps * len(pols))
    sel = []
    try:
        for n in names:
            _, title, _, _, sizes, flags = known[n]
            size = sizes[1] if a.quick else sizes[0]
            prog = exes[n] + [str(size)]
            foot, managed_peak, ie, outside_attune = imme.footprint(prog, bar, n, "pool" in pols)
            unmanaged = foot - managed_peak
            budget = int(foot * (1 - a.outside))
            sel.append({"name": n, "title": title, "flags": flags, "prog": prog, "footprint": foot, "ie": ie,
                        "unmanaged": unmanaged, "held": outside_attune,
                        "managed_budget": max(budget - unmanaged, 8 << 20)})
        node = int(sum(w["footprint"] for w in sel) * (1 - a.outside))
        pool = sum(w["managed_budget"] for w in sel)
        runs = {p: [] for p in pols}
        for rnd in range(a.reps):
            # Interleaved rounds, the order rotated so no policy always runs first.
            for k in range(len(pols)):
                p = pols[(k + rnd) % len(pols)]
                bar.set_description(f"round {rnd + 1} {p}")
                runs[p].append(policy_run(p, sel, tmp, node, pool, a.bw_dram_share, a.move_limit,
                                           a.report_dir))
                bar.update()
    finally:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
    res = {"date": time.strftime("%Y-%m-%d"), "reps": a.reps, "outside": a.outside, "node_mib": node >> 20,
           "pool_mib": pool >> 20, "pool_policy_mib": pool_policy_dram(sel, node) >> 20, "bw_dram_share": a.bw_dram_share, "policies": pols, "workflows": [],
           "totals": {}}
    failed = 0
    for i, w in enumerate(sel):
        row = {k: w[k] for k in ("name", "title", "flags", "footprint", "ie", "unmanaged", "managed_budget")}
        row["policies"] = {}
        for p in pols:
            rs = [r[i] for r in runs[p]]
            walls = [r["wall"] for r in rs]
            ok = all(r["ok"] for r in rs)
            failed += not ok
            med = statistics.median(walls)
            g = [r["grant"]["median"] for r in rs if r.get("grant")]
            row["policies"][p] = {"ok": ok, "median": med, "min": min(walls), "max": max(walls),
                                  "normalized": med / w["ie"], "errors": [r["stderr"] for r in rs if not r["ok"]][:1],
                                  "dram": statistics.median(g) if g else (w["managed_budget"] if p == "uniform" else None)}
        res["workflows"].append(row)
    ie_sum = sum(w["ie"] for w in sel)
    for p in pols:
        if all(w["policies"][p]["ok"] for w in res["workflows"]):
            res["totals"][p] = sum(w["policies"][p]["median"] for w in res["workflows"]) / ie_sum
    with open(os.path.join(a.out, "fig7.json"), "w") as f:
        json.dump(res, f, indent=1)
    cmdline = "python3 bench/fig7.py " + " ".join(sys.argv[1:])
    md = markdown(res, cmdline.strip())
    with open(os.path.join(a.out, "fig7.md"), "w") as f:
        f.write(md)
    made = plot(res, a.out)
    print(md)
    print(f"wrote {a.out}/fig7.json, {a.out}/fig7.md" + "".join(f", {os.path.basename(m)}" for m in made))
    if a.update_docs:
        imme.update_docs("fig7", "Figure 7: co-located workflows, DRAM by allocation policy (`bench/fig7.py`)", md)
    for w in res["workflows"]:
        for p, x in w["policies"].items():
            if not x["ok"]:
                print(f"{w['name']} {p}: FAILED {''.join(x['errors'])[-400:]}", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
