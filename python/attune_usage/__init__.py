"""attune usage: memory under-use of a cluster from Slurm job records and node samples.

Modules: ``sacct`` reads and cleans the records, ``jobs`` turns steps into per-job
utilization and imbalance, ``system`` works on node memory samples (utilization over time,
the shared-pool what-if), ``report`` writes text/JSON/CSV, ``plots`` the PNGs, ``cli`` ties
them together. Every computation is a function of data frames, testable without Slurm.
"""
__all__ = ["sacct", "jobs", "system", "report", "plots", "cli"]
