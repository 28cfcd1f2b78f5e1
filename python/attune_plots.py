"""Plots of the attune sub-commands, run by them when matplotlib is there (the numbers in
their JSON and CSV files never depend on this):

  python3 attune_plots.py profile DIR   curve.png (bandwidth-capacity curve), timeline.png
  python3 attune_plots.py lbench DIR    sweep.png (relative performance against the level)
"""
import csv
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def profile(out):
    xs, ys = [], []
    with open(f"{out}/curve.csv") as f:
        for r in csv.DictReader(f):
            xs.append(float(r["page_share"]) * 100)
            ys.append(float(r["access_share"]) * 100)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(xs, ys, label="measured")
    ax.plot([0, 100], [0, 100], "k--", lw=0.8, label="uniform")
    ax.set_xlabel("share of pages, hottest first (%)")
    ax.set_ylabel("share of accesses (%)")
    ax.set_title("Bandwidth-capacity scaling curve")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/curve.png", dpi=110)
    series = defaultdict(list)
    with open(f"{out}/timeline.csv") as f:
        for r in csv.DictReader(f):
            series[(r["pid"], r["tier"])].append((float(r["t"]), int(float(r["bytes"])) / 2**20))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for (pid, tier), pts in sorted(series.items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=f"{tier} (pid {pid})")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("MiB")
    ax.set_title("Resident bytes per tier")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{out}/timeline.png", dpi=110)


def lbench(out):
    d = json.load(open(f"{out}/sweep.json"))
    rows = d["rows"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([x["level"] for x in rows], [x["relative_performance"] for x in rows], "o-")
    ax.set_xlabel("level of interference (% of peak traffic)")
    ax.set_ylabel("relative performance")
    ax.set_title(d["program"][:60])
    ax.set_ylim(0, 1.1)
    fig.tight_layout()
    fig.savefig(f"{out}/sweep.png", dpi=110)


if __name__ == "__main__":
    {"profile": profile, "lbench": lbench}[sys.argv[1]](sys.argv[2])
