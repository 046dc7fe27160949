// The reduce-scale family's backward entry (csrc/entries.h), an extension of its own: a
// forward-only user never builds it, and exported KernelBench files never include it.

#include "../binding.cuh"
#include "backward_dispatch.cuh"

std::tuple<bool, std::vector<Tensor>, Tensor> reduce_scale_backward(
    const Tensor& x, const Tensor& g, Tensor& dx, const std::optional<Tensor>& weight, bool weight_grad,
    bool bias_grad, const std::optional<Tensor>& dw_part, int64_t op, IntList view, int64_t g_row_stride,
    double eps, const std::optional<Tensor>& stats, const std::optional<Tensor>& dh, int64_t dh_row_stride) {
  using namespace normscan;
  const View v = checked_view(x, dx, view);
  const bool fp32 = fp32_params(x, weight, std::nullopt);
  check_param(x, weight, v.length, fp32);
  NORMSCAN_CHECK(g.device() == x.device() && g.scalar_type() == x.scalar_type(),
                 "normscan: the gradient must have x's dtype and device");
  check_reach(g, g_row_stride, 1, 0, View{v.outer, v.length, 1, 0, 0, 0, 0, 0, 0}, "the gradient");
  if (dh) {
    NORMSCAN_CHECK(dh->device() == x.device() && dh->scalar_type() == x.scalar_type(),
                   "normscan: dh must have x's dtype and device");
    check_reach(*dh, dh_row_stride, 1, 0, View{v.outer, v.length, 1, 0, 0, 0, 0, 0, 0}, "dh");
  }
  NORMSCAN_CHECK(!weight_grad || weight, "normscan: a weight's gradient needs the weight");
  const DeviceGuard guard(x.device());
  const cudaStream_t stream = current_stream(x.device());
  DeviceInfo d;
  check_cuda(device_info(&d), "reading the device's properties");
  bool launched = false;
  std::vector<Tensor> params;
  Tensor part;
  NORMSCAN_DISPATCH_FLOATS(x.scalar_type(), "normscan::reduce_scale_backward", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    // The op's kernels for this weight (Op, or Fp32Params<Op>).
    const auto launch = [&](auto typed) {
      using Op = decltype(typed);
      using P = param_t<T, Op>;
      ReduceScaleBackwardArgs<T, P> a{data<T>(x), data<T>(g), mutable_data<T>(dx), weight ? data<P>(*weight) : nullptr,
                                      nullptr, nullptr, v, g_row_stride, eps,
                                      dh ? data<T>(*dh) : nullptr, dh_row_stride};
      NORMSCAN_CHECK(a.w == nullptr || Op::kWeighted, "normscan: reduce-scale op ", num(op),
                     " takes no weight: weight must be None");
      NORMSCAN_CHECK(stats.has_value() == Op::kRowStats, "normscan: reduce-scale op ", num(op),
                     Op::kRowStats ? " needs its forward's stats" : " takes no stats: stats must be None");
      if (stats) a.stats = checked_stats<A>(x, *stats, v.outer);
      // Partial sums a position: dw's, and a biased op's db beside it.
      const int sums_each = Op::kBiased ? 2 : 1;
      const int64_t sums = v.length * sums_each;
      cudaError_t asked = cudaSuccess;
      launched = with_reduce_scale_backward<T, Op>(a, d.major, &asked, [&](auto plan) {
        if (weight_grad) {
          int64_t slots = 0;
          check_cuda(plan.slots(v, &slots), "sizing the weight gradient's partial sums");
          const auto acc = sizeof(acc_t<T>) == 8 ? normscan::kDouble : normscan::kFloat;
          if (dw_part) {
            NORMSCAN_CHECK(dw_part->is_contiguous() && dw_part->scalar_type() == acc && dw_part->device() == x.device() &&
                               dw_part->dim() == 2 && dw_part->size(0) == slots && dw_part->size(1) == sums,
                           "normscan: dw_part must be a contiguous (", num(slots), ", ", num(sums), ") tensor of ",
                           sizeof(acc_t<T>) == 8 ? "float64" : "float32", " on x's device");
            part = *dw_part;
          } else {
            part = Tensor::empty({slots, sums}, acc, x.device());
          }
          a.dw_part = static_cast<acc_t<T>*>(part.data_ptr());
        }
        if (!v.empty()) check_cuda(plan.launch(a, stream), "reduce_scale_backward");
        if (weight_grad) {
          // dw, then db where asked (its partial sums are the kernel's either way): tensors of
          // their own (outputs may not alias).
          for (int j = 0; j < (bias_grad ? sums_each : 1); ++j) {
            params.push_back(Tensor::empty({v.length}, weight->scalar_type(), weight->device()));
            check_cuda(launch_dw_sum<P>(a.dw_part + j * v.length, part.size(0), sums, v.length,
                                        mutable_data<P>(params.back()), d.major >= 9, stream),
                       "summing the weight gradient's partial sums");
          }
        }
      });
      check_cuda(asked, "asking the device which thread-block clusters it runs");
    };
    const bool known =
        with_reduce_scale_op(op, [&](auto functor) { with_param_type<T, decltype(functor)>(fp32, launch); });
    NORMSCAN_CHECK(known, "normscan: no reduce-scale op has id ", num(op), " in this build");
  });
  return {launched, params, part};
}
