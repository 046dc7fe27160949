// Host checks and type choices shared by the fused row forms' entries: the residual form
// (binding.cu) and the out-dtype forms (out_binding.cu), both launching fused_rows.cuh's kernel.
#pragma once

#include "../binding.cuh"
#include "fused_rows.cuh"

namespace normscan {

// A (rows, length) operand of a fused form: on x's device, of `type`; whether its rows are
// contiguous and start on `align` bytes (its vectors' size: 16, less for a y narrower than x),
// as the kernel needs them.
inline bool fused_operand(const Tensor& x, const Tensor& t, normscan::ScalarType type, const char* name,
                          int64_t align = 16) {
  NORMSCAN_CHECK(t.dim() == 2 && t.sizes() == x.sizes() && t.device() == x.device() && t.scalar_type() == type,
                 "normscan: the fused form's ", name, " must be a (rows, length) tensor of x's shape and device, of "
                 "the dtype its form gives it (h: the residual's; y: x's, or out_dtype)");
  const bool rows_contiguous = t.size(1) <= 1 || t.stride(1) == 1;
  const bool rows_aligned = t.size(0) <= 1 || (t.stride(0) * t.element_size()) % align == 0;
  return rows_contiguous && rows_aligned && reinterpret_cast<uintptr_t>(t.const_data_ptr()) % align == 0;
}

// f(TypeTag<R>{}) for the residual's element type R: x's own, or float32 beside a 16-bit x.
template <typename T, typename F> void with_residual_type(bool same, F&& f) {
  if constexpr (sizeof(T) == 2) {
    if (!same) return f(TypeTag<float>{});
  }
  f(TypeTag<T>{});
}

// f(functor) for rms_norm's and layer_norm's ops, which have the fused forms; `what` names
// the form in the error for the others.
template <typename F> void with_fused_op(int64_t op, const char* what, F&& f) {
  const bool known = with_reduce_scale_op(op, [&](auto functor) {
    using Op = decltype(functor);
    if constexpr (Op::kFusedRowForms) {
      f(functor);
    } else {
      NORMSCAN_CHECK(false, "normscan: reduce-scale op ", num(op), " has no ", what, " (rms_norm and layer_norm do)");
    }
  });
  NORMSCAN_CHECK(known, "normscan: no reduce-scale op has id ", num(op), " in this build");
}

}  // namespace normscan
