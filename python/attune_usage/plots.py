"""PNG figures: utilization histogram + CDF (paper Fig. 1), imbalance (Fig. 2), system
utilization over time (Fig. 3), the pool what-if curve."""
import numpy as np


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _hist_cdf(ax, values, bins, xlabel, title):
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        ax.set_title(title + " (no data)")
        return
    w = np.full(v.size, 100.0 / v.size)
    ax.hist(v, bins=bins, weights=w, color="#4c72b0", edgecolor="white")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("jobs (%)")
    ax2 = ax.twinx()
    xs = np.sort(v)
    ax2.step(xs, np.arange(1, xs.size + 1) / xs.size * 100, where="post", color="#dd8452")
    ax2.set_ylabel("CDF (%)")
    ax2.set_ylim(0, 100)
    ax.set_title(title)


def write(out_dir, jobs, system=None, what_if=None):
    plt = _plt()
    files = []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    _hist_cdf(ax, jobs["util"] * 100, np.arange(0, 105, 5), "memory utilization per node (%)",
              "Job memory utilization")
    fig.tight_layout()
    fig.savefig(f"{out_dir}/utilization.png", dpi=110)
    files.append("utilization.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    imb = jobs["imbalance"].clip(upper=16)
    _hist_cdf(ax, imb, [1, 1.25, 1.5, 2, 3, 4, 6, 8, 12, 16], "imbalance (max / mean task RSS)",
              "Memory imbalance in jobs")
    ax.set_xscale("log", base=2)
    fig.tight_layout()
    fig.savefig(f"{out_dir}/imbalance.png", dpi=110)
    files.append("imbalance.png")
    plt.close(fig)

    if system is not None and len(system):
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
        a1.plot(system["time"], system["util"] * 100, lw=0.8)
        a1.set_ylabel("node memory in use (%)")
        a1.set_title("System-wide utilization (hourly)")
        a1.tick_params(axis="x", rotation=30)
        _hist_cdf(a2, system["util"] * 100, np.arange(0, 105, 5), "hourly utilization (%)", "Distribution")
        a2.set_ylabel("hours (%)")
        fig.tight_layout()
        fig.savefig(f"{out_dir}/system.png", dpi=110)
        files.append("system.png")
        plt.close(fig)

    if what_if is not None:
        sw = what_if["sweep"]
        gib = float(1 << 30)
        f = [r["local_share"] * 100 for r in sw]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.stackplot(f, [r["local_bytes"] / gib for r in sw], [r["pool_bytes"] / gib for r in sw],
                     labels=["local DRAM", "pool"], alpha=0.8)
        ax.axhline(what_if["installed_bytes"] / gib, color="k", ls="--", lw=1, label="installed")
        ax.set_xlabel("local share of each node's memory (%)")
        ax.set_ylabel("DRAM (GiB)")
        ax.set_title("Shared pool what-if")
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        fig.savefig(f"{out_dir}/pool_what_if.png", dpi=110)
        files.append("pool_what_if.png")
        plt.close(fig)
    return files
