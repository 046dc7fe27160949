// The Python-visible entry of each kernel family: one function a family, each built into its
// own extension on first use (normscan/_build.py). `view` is normscan/view.py's View.fields:
// (outer, length, inner, x's three strides, y's three strides), in elements. `op` is the
// op's id in the family's list (csrc/<family>/ops.cuh).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

// y = x * scale(reduce(x)) [* weight] along the view's length.
void reduce_scale(const at::Tensor& x, at::Tensor& y, const std::optional<at::Tensor>& weight, int64_t op,
                  at::IntArrayRef view, double eps);
// y = the scan of x along the view's length.
void scan(const at::Tensor& x, at::Tensor& y, int64_t op, at::IntArrayRef view, bool reverse, bool exclusive);
