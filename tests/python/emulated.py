"""Far memory emulated in the process, for test modules whose figures were calibrated on
it (`far = "memory,file"`; the default far tier is a file: test_far_default.py)."""
import os

import pytest


@pytest.fixture(scope="module", autouse=True)
def emulated_far():
    """ATTUNE_FAR=memory,file for every program the module starts, restored after it.

    The profiler parks sampled chunks in the first far tier and times their next touch; on
    the file tier its hot-part estimate of tests/run/skewed.c fell below these tests'
    bounds (4.2% of a 10% hot part found; docs/design/paging.md, "The default far tier")."""
    old = os.environ.get("ATTUNE_FAR")
    os.environ["ATTUNE_FAR"] = "memory,file"
    yield
    if old is None:
        os.environ.pop("ATTUNE_FAR", None)
    else:
        os.environ["ATTUNE_FAR"] = old
