"""Reading `sacct --parsable2` dumps: columns by header name, malformed lines counted.

The command the analyzer documents (README, docs/usage.md):

    sacct --allusers --parsable2 --noconvert --starttime START --endtime END \
      --format=JobID,JobName,User,Account,Partition,State,ExitCode,NNodes,NTasks,AllocCPUS,ReqMem,AllocTRES,MaxRSS,AveRSS,Elapsed,Start,End

Without -X/--allocations: the per-step lines carry the RSS figures. Other columns may be
added or left out; only JobID, State and MaxRSS are required.
"""
import csv
import io
import re
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

REQUIRED = ["JobID", "State", "MaxRSS"]
KNOWN = ["JobID", "JobIDRaw", "JobName", "User", "Account", "Partition", "State", "ExitCode",
         "NNodes", "NTasks", "AllocCPUS", "NCPUS", "ReqMem", "AllocTRES", "ReqTRES", "MaxRSS",
         "AveRSS", "Elapsed", "Start", "End", "NodeList"]

# 1234, 1234_7, 1234_[1-5%2], 1234+1 (heterogeneous component), each optionally .step
JOBID = re.compile(r"^(?P<job>\d+(?:_(?:\d+|\[[^\]]*\]))?(?:\+\d+)?)(?:\.(?P<step>[A-Za-z0-9_+-]+))?$")


class UsageInputError(Exception):
    """The input cannot be analyzed at all (no header, a required column missing)."""


@dataclass
class Records:
    frame: pd.DataFrame                     # one row per well-formed line, canonical column names
    lines: int = 0                          # data lines read (not counting the header)
    malformed: Counter = field(default_factory=Counter)   # reason -> lines
    examples: list = field(default_factory=list)          # (line number, reason) of the first few


def read(path_or_file) -> Records:
    if isinstance(path_or_file, (str, bytes)) and path_or_file != "-":
        with open(path_or_file, encoding="utf-8", errors="replace") as f:
            text = f.read()
    elif path_or_file == "-":
        import sys
        text = sys.stdin.read()
    else:
        text = path_or_file.read()
    return parse(text)


def parse(text: str) -> Records:
    # Records end at a newline only: str.splitlines() also breaks at form feeds, \x1c-\x1e,
    # \x85 and U+2028/9, which a job name may hold; that cut a good record in two
    # malformed ones (found by tests/python/test_usage_fuzz.py).
    lines = text.replace("\r\n", "\n").split("\n")
    start = 0
    while start < len(lines) and not lines[start].strip():
        start += 1
    if start == len(lines):
        raise UsageInputError("the job records are empty (expected a header line from sacct --parsable2)")
    header = lines[start]
    trailing = header.endswith("|")                 # --parsable (not parsable2) ends each line with '|'
    names = (header[:-1] if trailing else header).split("|")
    canon = {k.lower(): k for k in KNOWN}
    cols = [canon.get(n.strip().lower(), n.strip()) for n in names]
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        raise UsageInputError(
            f"the header has no {', '.join(missing)} column (header: {header[:120]!r}); "
            "produce the records with the sacct command in docs/usage.md")
    nf = len(cols) - 1
    rec = Records(frame=pd.DataFrame(columns=cols))
    good = []
    for i in range(start + 1, len(lines)):
        ln = lines[i]
        if not ln.strip():
            continue
        rec.lines += 1
        if trailing and ln.endswith("|"):
            ln = ln[:-1]
        if ln.count("|") != nf:
            _bad(rec, i + 1, "wrong number of fields")
            continue
        good.append(ln)
    if good:
        df = pd.read_csv(io.StringIO("\n".join(good)), sep="|", header=None, names=cols, dtype=str,
                         keep_default_na=False, quoting=csv.QUOTE_NONE, engine="c")
    else:
        df = pd.DataFrame(columns=cols, dtype=str)
    ids = df["JobID"].str.strip().str.extract(JOBID)
    badid = ids["job"].isna()
    if badid.any():
        for _ in range(int(badid.sum())):
            rec.malformed["job id not understood"] += 1
        rec.examples.extend((None, f"job id {v!r} not understood") for v in df.loc[badid, "JobID"].head(3))
        df = df[~badid]
        ids = ids[~badid]
    df = df.assign(job=ids["job"].values, step=ids["step"].fillna("").values)
    rec.frame = df.reset_index(drop=True)
    return rec


def _bad(rec: Records, lineno: int, reason: str):
    rec.malformed[reason] += 1
    if len(rec.examples) < 5:
        rec.examples.append((lineno, reason))
