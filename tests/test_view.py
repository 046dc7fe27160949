"""The (outer, length, inner) view (view.py) and its C++ twin."""

import math
import re

import pytest
import torch

from normscan import _build, view


def _view(shape, strides, dim):
    x = torch.empty_strided(shape, strides)
    return view.fold(x, view.output_like(x), dim)


def test_fold_rows_channels_and_views():
    v = _view((4, 6), (6, 1), 1)
    assert (v.outer, v.length, v.inner, v.x_so, v.x_sl, v.x_si) == (4, 6, 1, 6, 1, 1)
    v = _view((2, 3, 4, 5), (60, 20, 5, 1), 1)  # channel dim: strided
    assert (v.outer, v.length, v.inner, v.x_so, v.x_sl, v.x_si) == (2, 3, 20, 60, 20, 1)
    v = _view((2, 4, 5, 3), (60, 5, 1, 20), 3)  # channels-last, read where it lies
    assert (v.outer, v.length, v.inner) == (2, 3, 20)
    x = torch.empty(4, 8)[:, :7]  # sliced rows: own strides for x and y
    v = view.fold(x, view.output_like(x), 1)
    assert (v.outer, v.length, v.x_so, v.y_so) == (4, 7, 8, 7)
    x = torch.empty(6, 4).t()  # transposed: the other dim becomes the coalesced inner
    v = view.fold(x, view.output_like(x), 1)
    assert (v.outer, v.length, v.inner, v.x_so, v.x_sl, v.x_si) == (1, 6, 4, 0, 4, 1)
    x = torch.empty(2, 3, 4, 5)[:, :, 1:3, ::2]  # three runs: does not fold
    assert view.fold(x, view.output_like(x), 1) is None


def _addresses(v, x):
    """The elements a view reaches, as (outer, length, inner) of x's values."""
    return x.as_strided((v.outer, v.length, v.inner), (v.x_so, v.x_sl, v.x_si), x.storage_offset())


@pytest.mark.parametrize("shape,dim", [((4, 6), 1), ((4, 6), 0), ((2, 3, 4, 5), 1), ((2, 3, 4, 5), 3), ((7,), 0),
                                       ((), 0), ((3, 1, 5), 1), ((3, 1, 5), 2)])
def test_contiguous_shortcut_and_general_fold_reach_the_same_elements(shape, dim):
    x = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    lead, rest = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
    expected = x.reshape(lead, shape[dim] if shape else 1, rest)
    fast = view.fold(x, torch.empty_like(x), dim)
    assert torch.equal(_addresses(fast, x), expected)
    folded = _addresses(view.fold_strides(x, torch.empty_like(x), dim), x)
    # The general fold may fold differently, but each of its lines is one line of the op's dim.
    assert sorted(map(tuple, folded.transpose(1, 2).reshape(-1, folded.shape[1]).tolist())) == \
        sorted(map(tuple, expected.transpose(1, 2).reshape(-1, expected.shape[1]).tolist()))


def test_output_keeps_dense_layouts():
    x = torch.empty(2, 3, 4, 5).permute(0, 2, 3, 1)
    assert view.output_like(x).stride() == x.stride()
    x = torch.empty(4, 8)[:, :7]
    assert view.output_like(x).is_contiguous()


def test_prepare_copies_only_an_unfoldable_layout_and_checks_out():
    x = torch.randn(2, 3, 4, 9)[:, :, 1:3, ::2]
    px, y, v = view.prepare(x, 1)
    assert px.is_contiguous() and torch.equal(px, x) and v is not None
    x = torch.randn(6, 4).t()
    px, y, v = view.prepare(x, 1)
    assert px is x
    with pytest.raises(ValueError, match="does not fold with x"):
        view.prepare(torch.randn(2, 3, 4, 9)[:, :, 1:3, ::2], 1, out=torch.empty(2, 3, 2, 5).permute(3, 2, 1, 0))


def test_fields_are_the_cuda_views():
    """The binding takes the tuple as it is: its fields are csrc/device/view.cuh's, in order."""
    text = (_build.CSRC / "device" / "view.cuh").read_text()
    body = re.sub(r"//[^\n]*", "", text[text.index("struct View {"):text.index("static constexpr int kFields")])
    cuda = re.findall(r"\b(outer|length|inner|[xy]_s[oli])\b", body)
    assert tuple(cuda) == view.View._fields
    assert f"kFields = {len(view.View._fields)};" in text
