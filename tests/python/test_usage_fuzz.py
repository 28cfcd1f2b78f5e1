"""Property-based fuzzing (Hypothesis) of `attune usage`'s inputs: sacct dumps and node
samples, which come from clusters' own tools and hand edits. The rule (docs/usage.md): a
malformed line is counted, never fatal; only a missing header or required column stops
the analysis, with its message. Checked on any text and on dumps of real shape with junk
lines among good ones. CI runs a short budget per property; a long run:
ATTUNE_HYPOTHESIS_EXAMPLES=100000 python3 -m pytest -q tests/python/test_usage_fuzz.py"""
import io
import json
import os
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
from attune_usage import cli, jobs, report, sacct, system  # noqa: E402

EXAMPLES = int(os.environ.get("ATTUNE_HYPOTHESIS_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

HEADER = ("JobID|JobName|User|Account|Partition|State|ExitCode|NNodes|NTasks|AllocCPUS|ReqMem|"
          "AllocTRES|MaxRSS|AveRSS|Elapsed|Start|End")
NF = HEADER.count("|") + 1

# Text as a file read with errors="replace" can hold: no surrogates; a field holds no
# separator and no newline.
chars = st.characters(blacklist_categories=("Cs",))
field = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="|,\n\r"), max_size=16)
job_id = st.one_of(
    st.integers(1, 10**7).map(str),
    st.tuples(st.integers(1, 10**6), st.integers(0, 99)).map(lambda t: f"{t[0]}_{t[1]}"),
    st.tuples(st.integers(1, 10**6), st.sampled_from(["batch", "extern", "0", "1", "12"]))
      .map(lambda t: f"{t[0]}.{t[1]}"),
    field)
size = st.one_of(st.integers(0, 10**12).map(str),
                 st.tuples(st.integers(0, 10**7), st.sampled_from("KMGTkmgt")).map(lambda t: f"{t[0]}{t[1]}"),
                 st.sampled_from(["", "0", "16Gn", "4000Mc", "-5K", "1e400K", "nan", "inf"]),
                 field)
row = st.tuples(job_id, field, field, field, field,
                st.sampled_from(["COMPLETED", "FAILED", "OUT_OF_MEMORY", "CANCELLED by 0", "RUNNING", "PENDING", ""]) | field,
                field, st.integers(0, 64).map(str) | field, st.integers(0, 512).map(str) | field,
                st.integers(0, 4096).map(str) | field, size,
                st.sampled_from(["billing=4,cpu=4,mem=16G,node=1", "cpu=2,mem=4000M", ""]) | field,
                size, size, field, field, field).map("|".join)
junk = st.text(alphabet=chars, max_size=80).filter(lambda s: "\n" not in s and "\r" not in s)


def analyze(text, node_mem=64 << 30):
    """The whole pipeline as `attune usage --json` runs it; returns the summary."""
    rec = sacct.parse(text)
    df = jobs.analyze(rec, node_mem=node_mem)
    summary = report.summarize(df, rec, node_mem=node_mem, system=None, what_if=None, samples_dropped=0)
    json.loads(report.to_json(summary, df, None))
    report.text(summary)
    return rec, df


@SETTINGS
@given(st.text(alphabet=chars, max_size=2000))
def test_any_text_is_refused_with_a_message_or_analyzed(text):
    try:
        rec, _ = analyze(text)
    except sacct.UsageInputError as e:
        assert str(e)
        return
    assert sum(rec.malformed.values()) <= rec.lines


@SETTINGS
@given(st.lists(st.one_of(row, row, junk), max_size=40), st.booleans())
def test_junk_lines_are_counted_and_good_lines_kept(lines, trailing_bar):
    text = HEADER + ("|" if trailing_bar else "") + "\n" + "\n".join(lines) + "\n"
    rec, df = analyze(text)
    data = [l for l in lines if l.strip()]
    assert rec.lines == len(data)
    wrong_fields = sum(1 for l in data if (l[:-1] if trailing_bar and l.endswith("|") else l).count("|") != NF - 1)
    assert rec.malformed["wrong number of fields"] == wrong_fields
    # Every line is a row of the frame or a counted malformed line, never lost silently.
    assert len(rec.frame) + sum(rec.malformed.values()) >= rec.lines
    for col in ("max_rss", "utilization"):
        if col in df:
            vals = df[col].dropna()
            assert (vals >= 0).all(), (col, vals.min())


@SETTINGS
@given(st.lists(st.one_of(
    st.tuples(st.one_of(st.integers(0, 2**32).map(str), st.just("2026-11-01T10:00:00"), field),
              st.sampled_from(["n1", "n2", ""]) | field, size, size).map(",".join),
    junk), max_size=30))
def test_node_samples_any_rows(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("samples") / "nodes.csv"
    path.write_text("time,node,MemTotal,MemFree\n" + "\n".join(rows) + "\n")
    try:
        samples, dropped = system.read_samples(str(path))
    except system.SamplesError as e:
        assert str(e)
        return
    assert dropped >= 0
    if len(samples):
        assert (samples["total"] > 0).all() and (samples["used"] >= 0).all()
        assert (samples["used"] <= samples["total"]).all()
        u = system.utilization_over_time(samples)
        assert ((u["util"] >= 0) & (u["util"] <= 1.0 + 1e-9)).all(), u
        system.pool_what_if(samples)


@SETTINGS
@given(st.text(alphabet=chars, max_size=300))
def test_the_cli_never_fails_with_a_traceback(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cli") / "jobs.sacct"
    path.write_text(HEADER + "\n" + text)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli.main([str(path), "--node-mem", "64G", "--json"])
    assert rc == 0, err.getvalue()
    json.loads(out.getvalue())
