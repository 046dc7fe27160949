// The glue shared by the families' bindings (csrc/<family>/binding.cu): checks, the view,
// dtype dispatch, on tensors read through DLPack (python/tensor.h); no torch header. With
// NORMSCAN_FLOAT32_ONLY (the exported KernelBench files) only float32 kernels are built, and
// neither the fp16 header nor the fast path's code is read.
#pragma once

#include <optional>
#include <string>

#include "device/view.cuh"
#include "entries.h"
#include "python/tensor.h"
#ifndef NORMSCAN_FLOAT32_ONLY
#include "device/half.cuh"
#endif

namespace normscan {

// f(TypeTag<T>{}) for x's element type T (the kernels' types: float, double, __half,
// __nv_bfloat16); `what` names the entry in the error for others.
template <typename T> struct TypeTag {
  using type = T;
};
template <typename F> void dispatch_floats(ScalarType type, const char* what, F&& f) {
  switch (type) {
    case kFloat: return f(TypeTag<float>{});
#ifndef NORMSCAN_FLOAT32_ONLY
    case kDouble: return f(TypeTag<double>{});
    case kHalf: return f(TypeTag<__half>{});
    case kBFloat16: return f(TypeTag<__nv_bfloat16>{});
#endif
    default: throw Error(std::string(what) + ": x's dtype has no kernels (float32, float64, float16, bfloat16 do)");
  }
}

}  // namespace normscan

// Runs the lambda that follows with scalar_t x's element type.
#define NORMSCAN_DISPATCH_FLOATS(TYPE, NAME, ...) \
  ::normscan::dispatch_floats(TYPE, NAME, [&](auto normscan_tag_) { \
    using scalar_t = typename decltype(normscan_tag_)::type;        \
    (__VA_ARGS__)();                                                \
  })

namespace normscan {

template <typename T> const T* data(const Tensor& t) { return static_cast<const T*>(t.const_data_ptr()); }
template <typename T> T* mutable_data(Tensor& t) { return static_cast<T*>(t.mutable_data_ptr()); }

// Every element the view reaches is one of t's own: within the extent t's sizes and strides
// reach (strides are never negative).
inline void check_reach(const Tensor& t, int64_t so, int64_t sl, int64_t si, const View& v, const char* name) {
  if (v.empty()) return;
  NORMSCAN_CHECK(so >= 0 && sl >= 0 && si >= 0, "normscan: the view's strides of ", name, " must not be negative");
  const int64_t last = (v.outer - 1) * so + (v.length - 1) * sl + (v.inner - 1) * si;
  NORMSCAN_CHECK(last <= t.last_offset(), "normscan: the view reaches past ", name, "'s elements");
}

// Whether a weight and bias (either may be None) are float32 beside a 16-bit x (mixed
// precision's parameters); else they have x's dtype (check_param).
#ifdef NORMSCAN_FLOAT32_ONLY
inline bool fp32_params(const Tensor&, const std::optional<Tensor>&, const std::optional<Tensor>&) {
  return false;
}
#else
inline bool fp32_params(const Tensor& x, const std::optional<Tensor>& weight,
                        const std::optional<Tensor>& bias) {
  const auto type = x.scalar_type();
  const std::optional<Tensor>& given = weight ? weight : bias;
  return (type == kHalf || type == kBFloat16) && given && given->scalar_type() == kFloat;
}
#endif

// A weight or bias: none, or a contiguous tensor of `length` elements on x's device, of x's
// dtype, or float32 where `fp32` (fp32_params).
inline void check_param(const Tensor& x, const std::optional<Tensor>& t, int64_t length, bool fp32,
                        const char* name = "weight") {
  if (t) {
    NORMSCAN_CHECK(t->device() == x.device() && t->scalar_type() == (fp32 ? kFloat : x.scalar_type()) &&
                       t->is_contiguous() && t->numel() == length,
                   "normscan: ", name, " must be a contiguous tensor of ", num(length), " elements on x's device, of x's ",
                   "dtype (float32 too beside a 16-bit x, for the weight and bias alike)");
  }
}

// A statistics tensor of `count` statistics, two values each (count x 2: a grouped op's mean
// and squared deviations, layer_norm's mean and rstd), checked: contiguous, in x's
// accumulator type (acc_t), on x's device, and aligned to a pair (the backward's staged rows
// copy a row's pair as one).
template <typename A> A* checked_stats(const Tensor& x, const Tensor& stats, int64_t count) {
  NORMSCAN_CHECK(stats.is_contiguous() && stats.device() == x.device() &&
                     stats.scalar_type() == (sizeof(A) == 8 ? kDouble : kFloat) && stats.numel() == 2 * count &&
                     reinterpret_cast<uintptr_t>(stats.data_ptr()) % (2 * sizeof(A)) == 0,
                 "normscan: stats must be a contiguous (", num(count), ", 2) ", sizeof(A) == 8 ? "float64" : "float32",
                 " tensor on x's device, aligned to ", num(2 * sizeof(A)),
                 " bytes: use the forward's stats, or a clone of them");
  return static_cast<A*>(stats.data_ptr());
}

// The launches' scratch memory, as the dispatchers ask for it (alloc(bytes) -> void*): from
// torch's caching allocator on the current stream, held until this goes out of scope (the
// allocator then keeps it for the stream's later work, which runs after the launches).
class Workspace {
 public:
  explicit Workspace(const Tensor& like) : device_(like.device()) {}
  void* operator()(size_t bytes) {
    held_ = Tensor::empty({static_cast<int64_t>(bytes)}, kByte, device_);
    return held_.data_ptr();
  }

 private:
  Device device_;
  Tensor held_;
};

// x and y checked against each other and against the view; the view as the kernels take it.
inline View checked_view(const Tensor& x, const Tensor& y, IntList fields) {
  NORMSCAN_CHECK(x.is_cuda() && y.is_cuda(), "normscan: x and y must be CUDA tensors");
  NORMSCAN_CHECK(x.device() == y.device(), "normscan: x and y must be on one device");
  NORMSCAN_CHECK(x.scalar_type() == y.scalar_type(), "normscan: x and y must have one dtype");
  NORMSCAN_CHECK(fields.size() == View::kFields, "normscan: a view has ", num(View::kFields), " fields, got ",
                 num(static_cast<int64_t>(fields.size())));
  const View v = View::from(fields.data());
  check_reach(x, v.x_so, v.x_sl, v.x_si, v, "x");
  check_reach(y, v.y_so, v.y_sl, v.y_si, v, "y");
  return v;
}

#ifndef NORMSCAN_FLOAT32_ONLY  // the fast path's; the exported files bind their family's entry alone
// A new contiguous tensor of x's shape, dtype and device.
inline Tensor empty_contiguous_like(const Tensor& x) { return Tensor::empty(x.sizes(), x.scalar_type(), x.device()); }

// The eager call's common case (the <family>_contiguous entries, the public functions' fast
// path, whose call python/module.h's plain_call has checked for autocast, gradients and
// tensor subclasses): x a contiguous CUDA tensor of a float dtype, dim in [-ndim, ndim),
// `param` None or a contiguous tensor of shape (x.size(dim),) on x's device, of x's dtype (or
// float32 beside a 16-bit x). Its view around dim, or nullopt where the call is not that case:
// the Python path then checks it, says what is wrong or copies what must be, and launches.
inline std::optional<View> contiguous_view(const Tensor& x, int64_t dim, const std::optional<Tensor>& param) {
  const auto type = x.scalar_type();
  const bool built = type == kFloat || type == kHalf || type == kBFloat16 || type == kDouble;
  const int64_t ndim = x.dim(), rank = ndim > 0 ? ndim : 1;
  if (!built || !x.is_cuda() || !x.is_contiguous() || dim < -rank || dim >= rank) return std::nullopt;
  dim = dim < 0 ? dim + rank : dim;
  const int64_t length = ndim > 0 ? x.size(dim) : 1;
  const bool param_type = param && (param->scalar_type() == type ||
                                    ((type == kHalf || type == kBFloat16) && param->scalar_type() == kFloat));
  if (param && (param->device() != x.device() || !param_type || param->dim() != 1 ||
                param->size(0) != length || !param->is_contiguous())) {
    return std::nullopt;
  }
  const auto sizes = x.sizes();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= sizes[d];
  for (int64_t d = dim + 1; d < ndim; ++d) inner *= sizes[d];  // none of a 0-d x
  return View{outer, length, inner, length * inner, inner, 1, length * inner, inner, 1};
}
#endif

}  // namespace normscan
