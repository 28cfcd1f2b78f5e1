"""Command line of `attune usage` (also `python3 -m attune_usage`)."""
import argparse
import os
import sys

from . import jobs as jobs_mod
from . import report, sacct, system
from .units import parse_size_text

EPILOG = """\
Records come from (without -X: the step lines carry MaxRSS and AveRSS):
  sacct --allusers --parsable2 --noconvert -S START -E END \\
    --format=JobID,JobName,User,Account,Partition,State,ExitCode,NNodes,NTasks,AllocCPUS,ReqMem,AllocTRES,MaxRSS,AveRSS,Elapsed,Start,End
Node samples: CSV with time,node,MemTotal,MemFree (kB as in /proc/meminfo).
Exit status: 0 analyzed (malformed lines are counted, never fatal), 2 bad arguments or unreadable input.
"""


def build_parser():
    p = argparse.ArgumentParser(prog="attune usage", description="Memory under-use of a cluster from "
                                "Slurm job records (and node memory samples).", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("records", help="sacct --parsable2 output ('-' for standard input)")
    p.add_argument("--samples", metavar="CSV", help="node memory samples: time,node,MemTotal,MemFree")
    p.add_argument("--node-mem", metavar="SIZE", help="memory of a node (the paper's S_mem), e.g. 256G; "
                   "without it utilization is against the memory allocated per node")
    p.add_argument("--category-column", metavar="COL", help="a column of the records that names each job's category")
    p.add_argument("--category-rule", metavar="LABEL=REGEX", action="append",
                   help="category by job name (first match wins; repeatable), e.g. SIM='^(lmp|nek)'")
    p.add_argument("--local-share", type=float, default=0.5, metavar="F",
                   help="what-if: share of each node's memory kept local (0-1, default 0.5)")
    p.add_argument("--json", action="store_true", help="print JSON (summary and per-job records) instead of text")
    p.add_argument("--out", metavar="DIR", help="also write report.json, jobs.csv, summary.txt and PNG plots there")
    return p


def main(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    err = lambda m: (print(f"attune usage: {m}", file=sys.stderr), 2)[1]
    node_mem = None
    if a.node_mem:
        try:
            node_mem = parse_size_text(a.node_mem, "M")
        except ValueError as e:
            return err(f"--node-mem: {e}")
        if node_mem <= 0:
            return err("--node-mem must be above 0")
    if not 0 <= a.local_share <= 1:
        return err(f"--local-share {a.local_share}: must be between 0 and 1")
    if a.category_column and a.category_rule:
        return err("give --category-column or --category-rule, not both")
    try:
        rules = jobs_mod.parse_rules(a.category_rule)
    except ValueError as e:
        return err(str(e))
    try:
        rec = sacct.read(a.records)
    except OSError as e:
        return err(f"cannot read {a.records}: {e.strerror or e}")
    except sacct.UsageInputError as e:
        return err(str(e))
    try:
        jobs = jobs_mod.analyze(rec, node_mem=node_mem, category_column=a.category_column,
                                category_rules=rules)
    except KeyError:
        return err(f"--category-column {a.category_column}: no such column in the records")
    sysdf = what_if = None
    dropped = 0
    if a.samples:
        try:
            samples, dropped = system.read_samples(a.samples)
        except system.SamplesError as e:
            return err(str(e))
        if len(samples):
            sysdf = system.utilization_over_time(samples)
            what_if = system.pool_what_if(samples, local_share=a.local_share)
    summary = report.summarize(jobs, rec, node_mem=node_mem, system=sysdf, what_if=what_if,
                               samples_dropped=dropped)
    if a.out:
        try:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "report.json"), "w") as f:
                f.write(report.to_json(summary, jobs, sysdf))
            with open(os.path.join(a.out, "summary.txt"), "w") as f:
                f.write(report.text(summary))
            cols = [c for c in report.JOB_FIELDS if c in jobs]
            jobs[cols].to_csv(os.path.join(a.out, "jobs.csv"), index=False)
            from . import plots
            plots.write(a.out, jobs, sysdf, what_if)
        except OSError as e:
            return err(f"cannot write to {a.out}: {e.strerror or e}")
    if a.json:
        sys.stdout.write(report.to_json(summary, jobs, sysdf) + "\n")
    else:
        sys.stdout.write(report.text(summary))
    if rec.malformed and not a.json:
        ex = "; ".join(f"line {n}: {r}" if n else r for n, r in rec.examples[:3])
        print(f"attune usage: {sum(rec.malformed.values())} malformed lines skipped (e.g. {ex})", file=sys.stderr)
    return 0
