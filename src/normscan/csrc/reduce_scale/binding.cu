// The reduce-scale family's entries (csrc/entries.h).

#include "../binding.cuh"
#include "dispatch.cuh"

namespace {

void check_weight(const at::Tensor& x, const std::optional<at::Tensor>& weight, int64_t length,
                  const char* name = "weight") {
  if (weight) {
    TORCH_CHECK(weight->device() == x.device() && weight->scalar_type() == x.scalar_type() &&
                    weight->is_contiguous() && weight->numel() == length,
                "normscan: ", name, " must be a contiguous tensor of ", normscan::num(length),
                " elements, dtype and device of x");
  }
}

// A grouped op's grouping, checked against the view: (groups, span, stat_groups).
template <typename A>
normscan::Grouping<A> checked_grouping(at::IntArrayRef g, const normscan::View& v) {
  using normscan::num;
  TORCH_CHECK(g.size() == 3, "normscan: a grouped op's grouping is (groups, span, stat_groups), got ",
              num(static_cast<int64_t>(g.size())), " values");
  const int64_t rows = v.outer * v.inner;
  TORCH_CHECK(g[0] > 0 && g[1] > 0 && g[2] > 0 && v.length % g[1] == 0 && rows % g[2] == 0,
              "normscan: grouping (", num(g[0]), ", ", num(g[1]), ", ", num(g[2]), ") does not divide the view's ",
              num(rows), " rows of ", num(v.length));
  return normscan::Grouping<A>{g[0], g[1], g[2], nullptr};
}

}  // namespace

void reduce_scale(const at::Tensor& x, at::Tensor& y, const std::optional<at::Tensor>& weight,
                  const std::optional<at::Tensor>& bias, int64_t op, at::IntArrayRef view, double eps,
                  at::IntArrayRef grouping, const std::optional<at::Tensor>& stats) {
  using namespace normscan;
  const View v = checked_view(x, y, view);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  NORMSCAN_DISPATCH_FLOATS(x.scalar_type(), "normscan::reduce_scale", [&] {
    using T = cuda_t<scalar_t>;
    using A = acc_t<T>;
    const ReduceScaleArgs<T> common{data<T>(x), mutable_data<T>(y), weight ? data<T>(*weight) : nullptr,
                                    bias ? data<T>(*bias) : nullptr, v, eps};
    const bool known = with_reduce_scale_op(op, [&](auto functor) {
      using Op = decltype(functor);
      ArgsFor<T, Op> a{common};
      TORCH_CHECK(a.w == nullptr || Op::kWeighted, "normscan: reduce-scale op ", num(op),
                  " takes no weight: weight must be None");
      TORCH_CHECK(a.b == nullptr || Op::kBiased, "normscan: reduce-scale op ", num(op),
                  " takes no bias: bias must be None");
      TORCH_CHECK(grouping.empty() != Op::kGrouped, "normscan: reduce-scale op ", num(op),
                  Op::kGrouped ? " needs a grouping" : " takes no grouping");
      int64_t params = v.length;  // weight and bias elements: one a position, or a channel
      if constexpr (Op::kGrouped) {
        a.grouping = checked_grouping<A>(grouping, v);
        const Grouping<A>& g = a.grouping;
        params = g.groups * (v.length / g.span);
        if (stats) {
          TORCH_CHECK(stats->is_contiguous() && stats->device() == x.device() &&
                          stats->scalar_type() == (sizeof(A) == 8 ? at::kDouble : at::kFloat) &&
                          stats->numel() == 2 * g.stat_groups,
                      "normscan: stats must be a contiguous (", num(g.stat_groups), ", 2) ",
                      sizeof(A) == 8 ? "float64" : "float32", " tensor on x's device");
          a.grouping.stats = static_cast<A*>(stats->data_ptr());
        }
      }
      check_weight(x, weight, params);
      check_weight(x, bias, params, "bias");
      check_cuda(launch_reduce_scale<T, Op>(a, stream, Workspace(x)), "reduce_scale");
    });
    TORCH_CHECK(known, "normscan: no reduce-scale op has id ", num(op));
  });
}

#ifndef NORMSCAN_FORWARD_ONLY  // an exported KernelBench file has no backward
#include "backward_dispatch.cuh"

std::tuple<bool, at::Tensor> reduce_scale_backward(const at::Tensor& x, const at::Tensor& g, at::Tensor& dx,
                                                   const std::optional<at::Tensor>& weight, bool weight_grad,
                                                   const std::optional<at::Tensor>& dw_part, int64_t op,
                                                   at::IntArrayRef view, int64_t g_row_stride, double eps) {
  using namespace normscan;
  const View v = checked_view(x, dx, view);
  check_weight(x, weight, v.length);
  TORCH_CHECK(g.device() == x.device() && g.scalar_type() == x.scalar_type(),
              "normscan: the gradient must have x's dtype and device");
  check_reach(g, g_row_stride, 1, 0, View{v.outer, v.length, 1, 0, 0, 0, 0, 0, 0}, "the gradient");
  TORCH_CHECK(!weight_grad || weight, "normscan: a weight's gradient needs the weight");
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  DeviceInfo d;
  check_cuda(device_info(&d), "reading the device's properties");
  bool launched = false;
  at::Tensor part;
  NORMSCAN_DISPATCH_FLOATS(x.scalar_type(), "normscan::reduce_scale_backward", [&] {
    using T = cuda_t<scalar_t>;
    ReduceScaleBackwardArgs<T> a{data<T>(x), data<T>(g), mutable_data<T>(dx), weight ? data<T>(*weight) : nullptr,
                                 nullptr, v, g_row_stride, eps};
    const bool known = with_reduce_scale_op(op, [&](auto functor) {
      using Op = decltype(functor);
      TORCH_CHECK(a.w == nullptr || Op::kWeighted, "normscan: reduce-scale op ", num(op),
                  " takes no weight: weight must be None");
      launched = with_reduce_scale_backward<T, Op>(a, d.major, [&](auto plan) {
        if (weight_grad) {
          int64_t slots = 0;
          check_cuda(plan.slots(v, &slots), "sizing the weight gradient's partial sums");
          const auto acc = sizeof(acc_t<T>) == 8 ? at::kDouble : at::kFloat;
          if (dw_part) {
            TORCH_CHECK(dw_part->is_contiguous() && dw_part->scalar_type() == acc && dw_part->device() == x.device() &&
                            dw_part->dim() == 2 && dw_part->size(0) == slots && dw_part->size(1) == v.length,
                        "normscan: dw_part must be a contiguous (", num(slots), ", ", num(v.length), ") tensor of ",
                        sizeof(acc_t<T>) == 8 ? "float64" : "float32", " on x's device");
            part = *dw_part;
          } else {
            part = at::empty({slots, v.length}, x.options().dtype(acc));
          }
          a.dw_part = static_cast<acc_t<T>*>(part.data_ptr());
        }
        if (!v.empty()) check_cuda(plan.launch(a, stream), "reduce_scale_backward");
      });
    });
    TORCH_CHECK(known, "normscan: no reduce-scale op has id ", num(op));
  });
  return {launched, part};
}
#endif
