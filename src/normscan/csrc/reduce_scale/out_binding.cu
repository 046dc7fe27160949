// The reduce-scale family's out-dtype forms (csrc/entries.h, reduce_scale_out): an extension
// of their own, built on first use of out_dtype=, so that rms_norm's and layer_norm's own
// builds do not compile their kernels.

#include <algorithm>

#include "../device/fp8.cuh"
#include "fused_binding.cuh"

namespace {

using normscan::TypeTag;

// f(TypeTag<T>{}) for x's element type: float32, bfloat16 or float16; false for others.
template <typename F> bool with_x_type(normscan::ScalarType type, F&& f) {
  switch (type) {
    case normscan::kFloat: return f(TypeTag<float>{}), true;
    case normscan::kBFloat16: return f(TypeTag<__nv_bfloat16>{}), true;
    case normscan::kHalf: return f(TypeTag<__half>{}), true;
    default: return false;
  }
}

// f(TypeTag<O>{}) for y's element type beside x's T: FP8 (e4m3fn, e5m2), float32 beside a
// 16-bit x, a 16-bit type beside float32 x; false for others.
template <typename T, typename F> bool with_out_type(normscan::ScalarType out, F&& f) {
  if (out == normscan::kFloat8_e4m3fn) return f(TypeTag<__nv_fp8_e4m3>{}), true;
  if (out == normscan::kFloat8_e5m2) return f(TypeTag<__nv_fp8_e5m2>{}), true;
  if constexpr (sizeof(T) == 2) {
    if (out == normscan::kFloat) return f(TypeTag<float>{}), true;
  } else {
    if (out == normscan::kBFloat16) return f(TypeTag<__nv_bfloat16>{}), true;
    if (out == normscan::kHalf) return f(TypeTag<__half>{}), true;
  }
  return false;
}

}  // namespace

bool reduce_scale_out(const Tensor& x, const std::optional<Tensor>& residual,
                      const std::optional<Tensor>& h, Tensor& y, const std::optional<Tensor>& weight,
                      const std::optional<Tensor>& bias, int64_t op, double eps,
                      const std::optional<Tensor>& out_scale, const std::optional<Tensor>& row_scales) {
  using namespace normscan;
  NORMSCAN_CHECK(x.is_cuda() && x.dim() == 2, "normscan: the out-dtype form takes a (rows, length) CUDA x");
  NORMSCAN_CHECK(residual.has_value() == h.has_value(), "normscan: the out-dtype form takes a residual and h together");
  const auto type = x.scalar_type(), otype = y.scalar_type();
  const bool fp8 = otype == normscan::kFloat8_e4m3fn || otype == normscan::kFloat8_e5m2;
  NORMSCAN_CHECK(fp8 ? out_scale.has_value() != row_scales.has_value() : !out_scale && !row_scales,
                 "normscan: an FP8 y takes one of out_scale and row_scales; another y neither");
  NORMSCAN_CHECK(!out_scale || (out_scale->device() == x.device() && out_scale->scalar_type() == normscan::kFloat &&
                             out_scale->numel() == 1),
                 "normscan: out_scale must be one float32 value on x's device");
  NORMSCAN_CHECK(!row_scales || (row_scales->device() == x.device() && row_scales->scalar_type() == normscan::kFloat &&
                              row_scales->is_contiguous() && row_scales->numel() == x.size(0)),
                 "normscan: row_scales must be a contiguous float32 tensor of one value a row of x, on x's device");
  const bool half = type == normscan::kHalf || type == normscan::kBFloat16;
  const auto rtype = residual ? residual->scalar_type() : type;
  NORMSCAN_CHECK(rtype == type || (half && rtype == normscan::kFloat), "normscan: the residual must have x's dtype, or float32 "
                 "beside a 16-bit x");
  // y's vectors: x's 16-byte ones' elements in y's dtype (an FP8 y of bf16 x: 8 bytes).
  const int64_t y_align = std::min<int64_t>(16, 16 / x.element_size() * y.element_size());
  bool held = fused_operand(x, x, type, "x") & fused_operand(x, y, otype, "y", y_align);
  if (residual) held = held & fused_operand(x, *residual, rtype, "residual") & fused_operand(x, *h, rtype, "h");
  const bool fp32 = fp32_params(x, weight, bias);
  check_param(x, weight, x.size(1), fp32);
  check_param(x, bias, x.size(1), fp32, "bias");
  for (const auto* p : {&weight, &bias}) held = held && (!*p || reinterpret_cast<uintptr_t>((*p)->const_data_ptr()) % 16 == 0);
  const DeviceGuard guard(x.device());
  const cudaStream_t stream = current_stream(x.device());
  bool launched = false;
  const bool known_x = with_x_type(type, [&](auto x_type) {
    using T = typename decltype(x_type)::type;
    const bool known_out = with_out_type<T>(otype, [&](auto out_type) {
      using O = typename decltype(out_type)::type;
      // The kernel for residual type R (T without a residual).
      const auto launch = [&](auto residual_type, auto with_residual) {
        using R = typename decltype(residual_type)::type;
        constexpr bool kResidual = decltype(with_residual)::value;
        if (!held || !fused_rows_held<T, R, O>(x.size(1))) return;
        with_fused_op(op, "out-dtype form", [&](auto functor) {
          using F = decltype(functor);
          NORMSCAN_CHECK(!bias || F::kBiased, "normscan: rms_norm takes no bias: bias must be None");
          with_param_type<T, F>(fp32, [&](auto typed) {
            using Op = decltype(typed);
            using P = param_t<T, Op>;
            FusedRowsArgs<T, R, P, O> a{data<T>(x), nullptr, nullptr, mutable_data<O>(y),
                                        weight ? data<P>(*weight) : nullptr, bias ? data<P>(*bias) : nullptr,
                                        x.size(0), x.size(1), x.stride(0), 0, 0, y.stride(0), eps, nullptr,
                                        out_scale ? data<float>(*out_scale) : nullptr,
                                        row_scales ? mutable_data<float>(const_cast<Tensor&>(*row_scales)) : nullptr};
            if constexpr (kResidual) {
              a.residual = data<R>(*residual);
              a.h = mutable_data<R>(const_cast<Tensor&>(*h));
              a.r_stride = residual->stride(0);
              a.h_stride = h->stride(0);
            }
            check_cuda(launch_fused_norm_rows<T, R, P, O, Op, kResidual>(a, stream), "reduce_scale_out");
            launched = true;
          });
        });
      };
      if (residual) {
        with_residual_type<T>(rtype == type, [&](auto r) { launch(r, std::true_type{}); });
      } else {
        launch(TypeTag<T>{}, std::false_type{});
      }
    });
    NORMSCAN_CHECK(known_out, "normscan: out_dtype must be FP8 (float8_e4m3fn, float8_e5m2), float32 beside a 16-bit "
                   "x, or a 16-bit dtype beside float32 x");
  });
  NORMSCAN_CHECK(known_x, "normscan: the out-dtype form takes float32, bfloat16 or float16 x");
  return launched;
}
