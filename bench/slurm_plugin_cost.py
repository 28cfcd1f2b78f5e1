#!/usr/bin/env python3
"""What Attune's SPANK plugin costs a task, on a real single-node Slurm
(tests/python/slurm_cluster.py): `srun true` without the plugin in plugstack.conf, with it
but no --tm-* option (a job that needs no tiering), and with --tm-flags=CAP (the interposer
loaded into `true`), alternated round by round. Median wall time of srun per case.
Then a job twice its memory (tests/run/c_matrix, 432 MiB): in --mem=600M without Attune
(it fits), and in --mem=200M with --tm-flags=CAP on each far tier kind, alternated.

    python3 bench/slurm_plugin_cost.py --rounds 20 --over-limit 3   (root; make build first)
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from slurm_cluster import PLUGIN, ROOT, Slurm, available  # noqa: E402
from test_daemon import Daemon  # noqa: E402
import subprocess  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--over-limit", type=int, default=0, metavar="REPS",
                    help="also time a job twice its --mem, REPS times per case")
    a = ap.parse_args()
    why = available()
    if why:
        sys.exit(f"slurm_plugin_cost: {why}")
    times = {"no plugin": [], "plugin, no --tm option": [], "plugin, --tm-flags=CAP": []}
    with Slurm() as s:
        plug = (s.dir / "plugstack.conf").read_text()

        def plugstack(text):
            (s.dir / "plugstack.conf").write_text(text)
            s.run(["scontrol", "reconfigure"])
            time.sleep(1)

        def srun(*opts):
            t0 = time.perf_counter()
            p = s.run(["srun", "--mem=100M", *opts, "true"])
            dt = time.perf_counter() - t0
            if p.returncode:
                sys.exit(p.stderr)
            return dt
        for _ in range(a.rounds):
            plugstack("")
            times["no plugin"].append(srun())
            plugstack(plug)
            times["plugin, no --tm option"].append(srun())
            times["plugin, --tm-flags=CAP"].append(srun("--tm-flags=CAP"))
        over = over_limit(s, a.over_limit) if a.over_limit else None
    base = statistics.median(times["no plugin"])
    print(f"srun --mem=100M true, {a.rounds} rounds alternated ({PLUGIN.name}):")
    print("| case | median ms | p90 ms | vs no plugin |\n|---|---|---|---|")
    for k, v in times.items():
        v = sorted(v)
        m = statistics.median(v)
        print(f"| {k} | {m * 1e3:.1f} | {v[int(len(v) * 0.9) - 1] * 1e3:.1f} | {(m - base) * 1e3:+.1f} ms |")
    if over:
        print(f"\nc_matrix 400 (432 MiB), {a.over_limit} runs per case alternated:")
        print("| case | median s | runs (s) |\n|---|---|---|")
        for k, v in over.items():
            print(f"| {k} | {statistics.median(v):.2f} | {', '.join(f'{x:.2f}' for x in v)} |")


def over_limit(s, reps):
    d = Daemon(s.dir, "--dram", "2G", "--far-pool", "1G", sock=str(s.dir / "attuned.sock"))
    try:
        s.write_plugstack([f"socket={d.sock}"])
        s.run(["scontrol", "reconfigure"])
        time.sleep(1)
        subprocess.run(["gcc", "-O2", str(ROOT / "tests/run/c_matrix.c"), "-o", str(s.jobs / "c_matrix")],
                       check=True)
        cases = {"--mem=600M, no Attune": ["--mem=600M"],
                 "--mem=200M --tm-far=file": ["--mem=200M", "--tm-flags=CAP", "--tm-far=file"],
                 "--mem=200M --tm-far=file, buffered (ATTUNE_TIER_FILE_DIRECT=false)":
                     ["--mem=200M", "--tm-flags=CAP", "--tm-far=file", "--export=ALL,ATTUNE_TIER_FILE_DIRECT=false"],
                 "--mem=200M --tm-far=pool,file": ["--mem=200M", "--tm-flags=CAP", "--tm-far=pool,file"]}
        out = {k: [] for k in cases}
        for _ in range(reps):
            for k, opts in cases.items():
                t0 = time.perf_counter()
                p = s.run(["srun", *opts, "./c_matrix", "400"])
                if p.returncode or "c_matrix: OK" not in p.stdout:
                    sys.exit(f"{k}: {p.stdout}{p.stderr}")
                out[k].append(time.perf_counter() - t0)
        return out
    finally:
        d.stop()


if __name__ == "__main__":
    main()
