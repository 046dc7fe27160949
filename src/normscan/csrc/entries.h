// The Python-visible entry of each kernel family: one function a family, each built into its
// own extension on first use (normscan/_build.py). `view` is normscan/view.py's View.fields:
// (outer, length, inner, x's three strides, y's three strides), in elements. `op` is the
// op's id in the family's list (csrc/<family>/ops.cuh).
#pragma once

#include <optional>
#include <tuple>
#include <vector>

#include "python/tensor.h"

using normscan::IntList;
using normscan::Tensor;

// y = apply(x, scale(reduce(x))) [* weight] [+ bias] along the view's length (x * scale for
// the norms). A grouped op (group_norm's) also takes `grouping`, (groups, span, stat_groups):
// its weight and bias are per channel, and rows share statistics (csrc/reduce_scale/ops.cuh,
// Grouping); `stats`, where given, gets each statistic's mean and sum of squared deviations
// from it (stat_groups x 2, float32; float64 for float64 x). Others take an empty grouping;
// layer_norm's `stats`, where given, gets each row's mean and rstd (1 / sqrt(var + eps);
// outer * inner x 2, in the view's order).
void reduce_scale(const Tensor& x, Tensor& y, const std::optional<Tensor>& weight,
                  const std::optional<Tensor>& bias, int64_t op, IntList view, double eps,
                  IntList grouping, const std::optional<Tensor>& stats);
// The residual form of rms_norm and layer_norm (op): h = x + residual, in the residual's
// dtype (x's, or float32 beside a 16-bit x), and y = the op's norm of h [* weight] [+ bias]
// in x's, in one pass (csrc/reduce_scale/fused_rows.cuh). x, residual, h and y are (rows,
// length), each row contiguous, rows 16-byte aligned; layer_norm's `stats` as reduce_scale's.
// False (nothing written): no kernel holds rows of that length and alignment (the caller
// then adds and normalises apart).
bool reduce_scale_residual(const Tensor& x, const Tensor& residual, Tensor& h, Tensor& y,
                           const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, int64_t op,
                           double eps, const std::optional<Tensor>& stats);
// rms_norm's and layer_norm's (op) y in y's dtype, another than x's (csrc/reduce_scale/
// fused_rows.cuh): float32 beside 16-bit x, 16-bit beside float32 x, or FP8 (e4m3fn, e5m2) as
// y / scale saturated to the format's finite range, the scale `out_scale` (one float32) or
// each row's own, max |y| / the format's largest finite value (at least 1 / (512 x that)),
// written to `row_scales` (rows,). With a residual, h = x + residual into h first, as
// reduce_scale_residual's. y is computed in float32 and rounded once. Operands and the
// false result as reduce_scale_residual's.
bool reduce_scale_out(const Tensor& x, const std::optional<Tensor>& residual,
                      const std::optional<Tensor>& h, Tensor& y, const std::optional<Tensor>& weight,
                      const std::optional<Tensor>& bias, int64_t op, double eps,
                      const std::optional<Tensor>& out_scale, const std::optional<Tensor>& row_scales);
// The local passes of rms_norm and layer_norm (op) over a hidden dim sharded across ranks
// (csrc/reduce_scale/sharded.cuh; normscan/distributed.py merges the ranks' statistics): x a
// (rows, length) CUDA tensor, rows contiguous. reduce_scale_sharded_stats writes each row's
// sum of squares (rms_norm: stats (rows,)) or its mean and squared deviations from it
// (layer_norm: (rows, 2)), in x's accumulation dtype; reduce_scale_sharded_scale writes
// y = (x - stats[:, 0]) * stats[:, 1] [* weight] [+ bias] in x's dtype.
void reduce_scale_sharded_stats(const Tensor& x, Tensor& stats, int64_t op);
void reduce_scale_sharded_scale(const Tensor& x, Tensor& y, const Tensor& stats,
                                const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                                int64_t op);
// The gradients of reduce_scale's y, given g = dL/dy: dx into dx, and, when weight_grad,
// the weight's (second result, in the weight's dtype; then, when bias_grad too, a biased
// op's bias's), summed from per-row-group partial sums (third result; into dw_part when
// given, which must have their shape). g's rows are contiguous, g_row_stride apart. layer_norm
// takes its forward's `stats` (reduce_scale's, of this view), the others None. `dh` (rms_norm
// and layer_norm: the gradient reaching the residual form's h, of x's dtype, rows contiguous
// dh_row_stride apart) is added to dx. First result false (nothing written): no fused kernel
// serves the view.
std::tuple<bool, std::vector<Tensor>, Tensor> reduce_scale_backward(
    const Tensor& x, const Tensor& g, Tensor& dx, const std::optional<Tensor>& weight, bool weight_grad,
    bool bias_grad, const std::optional<Tensor>& dw_part, int64_t op, IntList view, int64_t g_row_stride,
    double eps, const std::optional<Tensor>& stats, const std::optional<Tensor>& dh, int64_t dh_row_stride);
// y = the scan of x along the view's length; a masked op's x times `mask` (bool, with x's
// strides along the view).
void scan(const Tensor& x, Tensor& y, int64_t op, IntList view, bool reverse, bool exclusive,
          const std::optional<Tensor>& mask);
// The public functions' fast path (normscan/registry.py): reduce_scale and scan of a
// contiguous CUDA x around `dim` (negative too) into a new y, returned; eps None is
// torch.finfo(x.dtype).eps. None (nothing launched) where the call is not that common case
// (python/module.h's plain_call and binding.cuh's contiguous_view say which): the caller then
// takes the checked path.
std::optional<Tensor> reduce_scale_contiguous(const Tensor& x, int64_t dim, int64_t op,
                                                  std::optional<double> eps, const std::optional<Tensor>& weight);
std::optional<Tensor> scan_contiguous(const Tensor& x, int64_t dim, int64_t op, bool reverse, bool exclusive);
// cumprod's gradient (op: ProdOp's id), given g = dL/dy of scan's y: dx into dx, laid out as
// the view's y. g's rows are contiguous, g_row_stride apart. False (nothing written): no
// fused kernel serves the view (normscan/backward.py then takes PyTorch's gradient).
bool scan_backward(const Tensor& x, const Tensor& g, Tensor& dx, int64_t op, IntList view,
                   int64_t g_row_stride, bool reverse, bool exclusive);
