"""Slurm's memory strings ("2048K", "1.50G", "4000Mn", "mem=16G") as bytes, vectorized."""
import numpy as np
import pandas as pd

_MULT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_UNITS = "KMGTP"


def parse_size(series: pd.Series, base: str):
    """Sizes in bytes and a mask of cells that are present but not a size.

    A number without a unit is in ``base`` ("K" for RSS and VM fields, which is sacct's own
    unit; "M" for requested memory, Slurm's default). Empty cells are NaN and not malformed.
    Also returns the per-node/per-CPU suffix of old ReqMem values ('n', 'c' or '').
    """
    # String slicing, not a regular expression (str.extract runs Python per cell; it was
    # the largest cost of a million-line run before, docs/benchmarks.md).
    s = series.fillna("").astype(str).str.strip()
    last = s.str[-1:]
    per = last.where(last.isin(["n", "c"]), "")
    s = s.where(per == "", s.str[:-1])
    s = s.where(~s.str.endswith("iB"), s.str[:-2])
    s = s.where(~s.str.endswith("B"), s.str[:-1])
    unit = s.str[-1:].str.upper()
    has_unit = unit.isin(list(_UNITS))
    num = pd.to_numeric(s.where(~has_unit, s.str[:-1]), errors="coerce")
    # Infinite sizes ("inf", "1e400K") are not sizes: they made used = inf - inf = NaN
    # and utilization NaN (found by tests/python/test_usage_fuzz.py).
    num = num.where((num >= 0) & np.isfinite(num))
    unit = unit.where(has_unit, base)
    val = num * unit.map(_MULT).astype(float)
    bad = num.isna() & s.ne("")
    return val, bad, per


def tres_mem(series: pd.Series):
    """The mem= entry of a TRES string ("cpu=4,mem=16G,node=2") in bytes (MiB when unitless)."""
    s = series.fillna("").astype(str)
    raw = s.str.extract(r"(?:^|,)mem=([^,]*)")[0]
    val, bad, _ = parse_size(raw, "M")
    return val, bad


def parse_size_text(text: str, base: str = "M") -> float:
    """One size from the command line ("256G", "512M", "1.5T"); ValueError otherwise."""
    val, bad, per = parse_size(pd.Series([text]), base)
    if bad.iloc[0] or np.isnan(val.iloc[0]) or per.iloc[0]:
        raise ValueError(f"not a size: {text!r} (examples: 256G, 512M, 1.5T)")
    return float(val.iloc[0])


def human(n) -> str:
    if n is None or (isinstance(n, float) and np.isnan(n)):
        return "-"
    for u in ["B", "KiB", "MiB", "GiB", "TiB"]:
        if abs(n) < 1024 or u == "TiB":
            return f"{n:.0f} {u}" if u == "B" else f"{n:.1f} {u}"
        n /= 1024
    return str(n)
