"""The reference expressions (reference.py): the semantics promised, special cases included."""

import pytest
import torch

from normscan import reference


def test_zero_rows_and_scan_flags():
    x = torch.zeros(2, 3)
    assert reference.l2_normalize(x).isnan().all()
    assert reference.rms_norm(x, 1, eps=0.0).isnan().all()
    v = torch.tensor([[2.0, 3.0, 4.0]])
    assert reference.cumprod(v, 1, exclusive=True).tolist() == [[1.0, 2.0, 6.0]]
    assert reference.cumprod(v, 1, reverse=True).tolist() == [[24.0, 12.0, 4.0]]
    assert reference.cumsum(v, 1, reverse=True, exclusive=True).tolist() == [[7.0, 4.0, 0.0]]
    assert reference.cumsum(torch.empty(2, 0), 1, exclusive=True).shape == (2, 0)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("exclusive", [False, True])
def test_zero_d_scans_are_one_element(reverse, exclusive):
    x = torch.tensor(2.5)
    assert reference.cumsum(x, 0, reverse, exclusive).item() == (0.0 if exclusive else 2.5)
    assert reference.cumprod(x, -1, reverse, exclusive).item() == (1.0 if exclusive else 2.5)
    assert reference.cumsum(x, 0, reverse, exclusive).shape == ()


def test_weight_broadcasts_along_dim_and_on_zero_d():
    x = torch.randn(2, 3, 4)
    w = torch.rand(3)
    torch.testing.assert_close(reference.rms_norm(x, 1, 1e-5, w), reference.rms_norm(x, 1, 1e-5) * w[:, None])
    torch.testing.assert_close(reference.rms_norm(x, -2, 1e-5, w), reference.rms_norm(x, 1, 1e-5, w))
    y = reference.rms_norm(torch.tensor(2.5), 0, 1e-5, torch.tensor([2.0]))
    assert y.shape == ()


def test_in_float32_rounds_once_and_leaves_wide_types_alone():
    x = torch.tensor([[300.0, -400.0]], dtype=torch.float16)
    w = torch.tensor([1.5, 2.0], dtype=torch.float16)
    y = reference.in_float32(reference.rms_norm)(x, 1, 1e-5, w)
    assert y.dtype == torch.float16
    assert torch.equal(y, reference.rms_norm(x.float(), 1, 1e-5, w.float()).half())
    d = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(reference.in_float32(reference.cumsum)(d, 1), torch.cumsum(d, 1))
