// The reduce-scale family's entries (csrc/entries.h).

#include "../binding.cuh"
#include "dispatch.cuh"
#include "fused_binding.cuh"
#include "sharded.cuh"

namespace {

// A grouped op's grouping, checked against the view: (groups, span, stat_groups).
template <typename A>
normscan::Grouping<A> checked_grouping(IntList g, const normscan::View& v) {
  using normscan::num;
  NORMSCAN_CHECK(g.size() == 3, "normscan: a grouped op's grouping is (groups, span, stat_groups), got ",
                 num(static_cast<int64_t>(g.size())), " values");
  const int64_t rows = v.outer * v.inner;
  NORMSCAN_CHECK(g[0] > 0 && g[1] > 0 && g[2] > 0 && v.length % g[1] == 0 && rows % g[2] == 0,
                 "normscan: grouping (", num(g[0]), ", ", num(g[1]), ", ", num(g[2]), ") does not divide the view's ",
                 num(rows), " rows of ", num(v.length));
  return normscan::Grouping<A>{g[0], g[1], g[2], nullptr};
}

// reduce_scale on a checked view.
void launch_view(const Tensor& x, Tensor& y, const std::optional<Tensor>& weight,
                 const std::optional<Tensor>& bias, int64_t op, const normscan::View& v, double eps,
                 IntList grouping, const std::optional<Tensor>& stats) {
  using namespace normscan;
  const DeviceGuard guard(x.device());
  const cudaStream_t stream = current_stream(x.device());
  const bool fp32 = fp32_params(x, weight, bias);
  NORMSCAN_DISPATCH_FLOATS(x.scalar_type(), "normscan::reduce_scale", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    // The op's kernels for these parameters (Op, or Fp32Params<Op>).
    const auto launch = [&](auto typed) {
      using Op = decltype(typed);
      using P = param_t<T, Op>;
      const ReduceScaleArgs<T, P> common{data<T>(x), mutable_data<T>(y), weight ? data<P>(*weight) : nullptr,
                                         bias ? data<P>(*bias) : nullptr, v, eps};
      ArgsFor<T, Op> a{common};
      NORMSCAN_CHECK(a.w == nullptr || Op::kWeighted, "normscan: reduce-scale op ", num(op),
                     " takes no weight: weight must be None");
      NORMSCAN_CHECK(a.b == nullptr || Op::kBiased, "normscan: reduce-scale op ", num(op),
                     " takes no bias: bias must be None");
      NORMSCAN_CHECK(grouping.empty() != Op::kGrouped, "normscan: reduce-scale op ", num(op),
                     Op::kGrouped ? " needs a grouping" : " takes no grouping");
      NORMSCAN_CHECK(!stats || kWritesStats<Op>, "normscan: reduce-scale op ", num(op), " writes no statistics: stats must be None");
      int64_t params = v.length;  // weight and bias elements: one a position, or a channel
      if constexpr (Op::kGrouped) {
        a.grouping = checked_grouping<A>(grouping, v);
        const Grouping<A>& g = a.grouping;
        params = g.groups * (v.length / g.span);
        if (stats) a.grouping.stats = checked_stats<A>(x, *stats, g.stat_groups);
      } else if constexpr (Op::kRowStats) {
        a.stats = stats ? checked_stats<A>(x, *stats, v.outer * v.inner) : nullptr;
      }
      check_param(x, weight, params, fp32);
      check_param(x, bias, params, fp32, "bias");
      check_cuda(launch_reduce_scale<T, Op>(a, stream, Workspace(x)), "reduce_scale");
    };
    const bool known =
        with_reduce_scale_op(op, [&](auto functor) { with_param_type<T, decltype(functor)>(fp32, launch); });
    NORMSCAN_CHECK(known, "normscan: no reduce-scale op has id ", num(op), " in this build");
  });
}

}  // namespace

void reduce_scale(const Tensor& x, Tensor& y, const std::optional<Tensor>& weight,
                  const std::optional<Tensor>& bias, int64_t op, IntList view, double eps,
                  IntList grouping, const std::optional<Tensor>& stats) {
  launch_view(x, y, weight, bias, op, normscan::checked_view(x, y, view), eps, grouping, stats);
}

#ifndef NORMSCAN_FLOAT32_ONLY  // the residual form and the fast path (binding.cuh)
bool reduce_scale_residual(const Tensor& x, const Tensor& residual, Tensor& h, Tensor& y,
                           const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, int64_t op,
                           double eps, const std::optional<Tensor>& stats) {
  using namespace normscan;
  NORMSCAN_CHECK(x.is_cuda() && x.dim() == 2, "normscan: the residual form takes a (rows, length) CUDA x");
  const auto type = x.scalar_type(), rtype = residual.scalar_type();
  const bool half = type == normscan::kHalf || type == normscan::kBFloat16;
  NORMSCAN_CHECK(rtype == type || (half && rtype == normscan::kFloat), "normscan: the residual must have x's dtype, or float32 "
                 "beside a 16-bit x");
  bool held = fused_operand(x, x, type, "x") & fused_operand(x, residual, rtype, "residual") &
              fused_operand(x, h, rtype, "h") & fused_operand(x, y, type, "y");
  const bool fp32 = fp32_params(x, weight, bias);
  check_param(x, weight, x.size(1), fp32);
  check_param(x, bias, x.size(1), fp32, "bias");
  for (const auto* p : {&weight, &bias}) held = held && (!*p || reinterpret_cast<uintptr_t>((*p)->const_data_ptr()) % 16 == 0);
  const DeviceGuard guard(x.device());
  const cudaStream_t stream = current_stream(x.device());
  bool launched = false;
  NORMSCAN_DISPATCH_FLOATS(type, "normscan::reduce_scale_residual", [&] {
    using T = scalar_t;
    with_residual_type<T>(rtype == type, [&](auto residual_type) {
      using R = typename decltype(residual_type)::type;
      if (!held || !fused_rows_held<T>(x.size(1))) return;
      const auto launch = [&](auto typed) {
        using Op = decltype(typed);
        using P = param_t<T, Op>;
        using A = acc_t<T>;
        const FusedRowsArgs<T, R, P> a{data<T>(x), data<R>(residual), mutable_data<R>(h), mutable_data<T>(y),
                                       weight ? data<P>(*weight) : nullptr, bias ? data<P>(*bias) : nullptr,
                                       x.size(0), x.size(1), x.stride(0), residual.stride(0), h.stride(0), y.stride(0),
                                       eps, stats ? checked_stats<A>(x, *stats, x.size(0)) : nullptr};
        check_cuda(launch_fused_norm_rows<T, R, P, T, Op, true>(a, stream), "reduce_scale_residual");
        launched = true;
      };
      with_fused_op(op, "residual form", [&](auto functor) {
        using F = decltype(functor);
        NORMSCAN_CHECK(!stats || F::kRowStats, "normscan: rms_norm writes no statistics: stats must be None");
        NORMSCAN_CHECK(!bias || F::kBiased, "normscan: rms_norm takes no bias: bias must be None");
        with_param_type<T, F>(fp32, launch);
      });
    });
  });
  return launched;
}

namespace {

// x as the sharded-hidden kernels take it: (rows, length), rows contiguous.
template <typename T> normscan::ShardedRows<T> sharded_rows(const Tensor& x) {
  NORMSCAN_CHECK(x.is_cuda() && x.dim() == 2 && (x.size(1) <= 1 || x.stride(1) == 1),
                 "normscan: the sharded-hidden passes take a (rows, length) CUDA x, rows contiguous");
  const bool vectors = x.size(1) % normscan::vec16<T>() == 0 && reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 16 == 0 &&
                       (x.size(0) <= 1 || (x.stride(0) * x.element_size()) % 16 == 0);
  return {normscan::data<T>(x), x.size(0), x.size(1), x.stride(0), vectors};
}

}  // namespace

void reduce_scale_sharded_stats(const Tensor& x, Tensor& stats, int64_t op) {
  using namespace normscan;
  const DeviceGuard guard(x.device());
  const cudaStream_t stream = current_stream(x.device());
  NORMSCAN_DISPATCH_FLOATS(x.scalar_type(), "normscan::reduce_scale_sharded_stats", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const ShardedRows<T> a = sharded_rows<T>(x);
    with_fused_op(op, "sharded-hidden passes", [&](auto functor) {
      constexpr bool centered = decltype(functor)::kCentered;
      NORMSCAN_CHECK(stats.is_contiguous() && stats.device() == x.device() && stats.numel() == (centered ? 2 : 1) * a.rows &&
                         stats.scalar_type() == (sizeof(A) == 8 ? normscan::kDouble : normscan::kFloat),
                     "normscan: the partial statistics must be a contiguous tensor of ", centered ? "(rows, 2)" : "(rows,)",
                     " in x's accumulation dtype on x's device");
      check_cuda(launch_sharded_partial_stats<T, centered>(a, static_cast<A*>(stats.data_ptr()), stream),
                 "reduce_scale_sharded_stats");
    });
  });
}

void reduce_scale_sharded_scale(const Tensor& x, Tensor& y, const Tensor& stats,
                                const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                                int64_t op) {
  using namespace normscan;
  NORMSCAN_CHECK(y.sizes() == x.sizes() && y.scalar_type() == x.scalar_type() && y.device() == x.device() &&
                     (y.size(1) <= 1 || y.stride(1) == 1),
                 "normscan: y must be a (rows, length) tensor of x's dtype and device, rows contiguous");
  const bool fp32 = fp32_params(x, weight, bias);
  check_param(x, weight, x.size(1), fp32);
  check_param(x, bias, x.size(1), fp32, "bias");
  const DeviceGuard guard(x.device());
  const cudaStream_t stream = current_stream(x.device());
  NORMSCAN_DISPATCH_FLOATS(x.scalar_type(), "normscan::reduce_scale_sharded_scale", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    ShardedRows<T> a = sharded_rows<T>(x);
    a.vectors = a.vectors && reinterpret_cast<uintptr_t>(y.const_data_ptr()) % 16 == 0 &&
                (y.size(0) <= 1 || (y.stride(0) * y.element_size()) % 16 == 0);
    for (const auto* p : {&weight, &bias}) a.vectors = a.vectors && (!*p || reinterpret_cast<uintptr_t>((*p)->const_data_ptr()) % 16 == 0);
    const A* s = checked_stats<A>(x, stats, a.rows);
    with_fused_op(op, "sharded-hidden passes", [&](auto functor) {
      using Op = decltype(functor);
      NORMSCAN_CHECK(!bias || Op::kBiased, "normscan: rms_norm takes no bias: bias must be None");
      with_param_type<T, Op>(fp32, [&](auto typed) {
        using P = param_t<T, decltype(typed)>;
        check_cuda(launch_sharded_scale<T, P>(a, mutable_data<T>(y), y.stride(0), s, weight ? data<P>(*weight) : nullptr,
                                              bias ? data<P>(*bias) : nullptr, stream),
                   "reduce_scale_sharded_scale");
      });
    });
  });
}

// torch.finfo(dtype).eps: what eps=None stands for (F.rms_norm's default).
static double dtype_eps(normscan::ScalarType type) {
  switch (type) {
    case normscan::kHalf: return 0x1p-10;
    case normscan::kBFloat16: return 0x1p-7;
    case normscan::kDouble: return 0x1p-52;
    default: return 0x1p-23;
  }
}

std::optional<Tensor> reduce_scale_contiguous(const Tensor& x, int64_t dim, int64_t op,
                                                  std::optional<double> eps, const std::optional<Tensor>& weight) {
  const std::optional<normscan::View> v = normscan::contiguous_view(x, dim, weight);
  if (!v) return std::nullopt;
  Tensor y = normscan::empty_contiguous_like(x);
  if (!v->empty()) launch_view(x, y, weight, std::nullopt, op, *v, eps ? *eps : dtype_eps(x.scalar_type()), {}, std::nullopt);
  return y;
}
#endif
