"""Every kernel family on a CUDA device: each case of each op (testing.py) against float64.
NORMSCAN_TEST_HUGE=0 leaves out the >2**31-element cases (tens of GB of device memory: they fit an 80 GB H100)."""

import os

import pytest
import torch

from normscan.bench import testing

CASES = testing.cases(huge=os.environ.get("NORMSCAN_TEST_HUGE", "1") != "0")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[f"{c.spec.family.name}: {c.name}" for c in CASES])
def test_case_against_float64(case):
    result = testing.check(case)
    torch.cuda.empty_cache()
    assert result.passed, f"{case.name}: error {result.error:.3e} > bound {result.bound:.1e} {result.detail}"
