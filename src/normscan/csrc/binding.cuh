// Torch glue shared by the families' bindings (csrc/<family>/binding.cu): checks, the
// view, dtype dispatch. Only the bindings see torch. With NORMSCAN_FLOAT32_ONLY (the
// exported KernelBench files) only float32 kernels are built, and neither
// the fp16 header nor the fast path's code is read.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/cuda/EmptyTensor.h>  // not ATen/ops/empty.h, seconds of each build's parse (docs/design-notes.md)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>
#include <string>

#include "device/view.cuh"
#include "entries.h"
#ifndef NORMSCAN_FLOAT32_ONLY
#include <ATen/core/grad_mode.h>  // the fast path's (contiguous_view)
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "device/half.cuh"
#endif

#ifdef NORMSCAN_FLOAT32_ONLY
#define NORMSCAN_DISPATCH_FLOATS(TYPE, NAME, ...) AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__))
#else
#define NORMSCAN_DISPATCH_FLOATS(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)
#endif

namespace normscan {

// The kernels' element type for a torch scalar type.
template <typename T> struct CudaType { using type = T; };
#ifndef NORMSCAN_FLOAT32_ONLY
template <> struct CudaType<at::Half> { using type = __half; };
template <> struct CudaType<at::BFloat16> { using type = __nv_bfloat16; };
#endif
template <typename T> using cuda_t = typename CudaType<T>::type;

template <typename T> const T* data(const at::Tensor& t) { return static_cast<const T*>(t.const_data_ptr()); }
template <typename T> T* mutable_data(at::Tensor& t) { return static_cast<T*>(t.mutable_data_ptr()); }

// Numbers in messages go through std::to_string: streaming an int64_t through c10::str
// (ostream::_M_insert<long>, instantiated in the extension) crashed in libstdc++'s locale
// code on the device's toolchain (docs/design-notes.md); strings stream fine.
inline std::string num(int64_t v) { return std::to_string(v); }

inline void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "normscan: ", what, " failed: ", cudaGetErrorString(err));
}

// Every element the view reaches lies in t's storage (strides are never negative).
inline void check_reach(const at::Tensor& t, int64_t so, int64_t sl, int64_t si, const View& v, const char* name) {
  if (v.empty()) return;
  TORCH_CHECK(so >= 0 && sl >= 0 && si >= 0, "normscan: the view's strides of ", name, " must not be negative");
  const int64_t last = t.storage_offset() + (v.outer - 1) * so + (v.length - 1) * sl + (v.inner - 1) * si;
  TORCH_CHECK(last < static_cast<int64_t>(t.storage().nbytes() / t.itemsize()), "normscan: the view reaches past ",
              name, "'s storage");
}

// Whether a weight and bias (either may be None) are float32 beside a 16-bit x (mixed
// precision's parameters); else they have x's dtype (check_param).
#ifdef NORMSCAN_FLOAT32_ONLY
inline bool fp32_params(const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&) {
  return false;
}
#else
inline bool fp32_params(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                        const std::optional<at::Tensor>& bias) {
  const auto type = x.scalar_type();
  const std::optional<at::Tensor>& given = weight ? weight : bias;
  return (type == at::kHalf || type == at::kBFloat16) && given && given->scalar_type() == at::kFloat;
}
#endif

// A weight or bias: none, or a contiguous tensor of `length` elements on x's device, of x's
// dtype, or float32 where `fp32` (fp32_params).
inline void check_param(const at::Tensor& x, const std::optional<at::Tensor>& t, int64_t length, bool fp32,
                        const char* name = "weight") {
  if (t) {
    TORCH_CHECK(t->device() == x.device() && t->scalar_type() == (fp32 ? at::kFloat : x.scalar_type()) &&
                    t->is_contiguous() && t->numel() == length,
                "normscan: ", name, " must be a contiguous tensor of ", num(length), " elements on x's device, of x's ",
                "dtype (float32 too beside a 16-bit x, for the weight and bias alike)");
  }
}

// A statistics tensor of `count` statistics, two values each (count x 2: a grouped op's mean
// and squared deviations, layer_norm's mean and rstd), checked: contiguous, in x's
// accumulator type (acc_t), on x's device, and aligned to a pair (the backward's staged rows
// copy a row's pair as one).
template <typename A> A* checked_stats(const at::Tensor& x, const at::Tensor& stats, int64_t count) {
  TORCH_CHECK(stats.is_contiguous() && stats.device() == x.device() &&
                  stats.scalar_type() == (sizeof(A) == 8 ? at::kDouble : at::kFloat) && stats.numel() == 2 * count &&
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
  explicit Workspace(const at::Tensor& like) : options_(like.options().dtype(at::kByte)) {}
  void* operator()(size_t bytes) {
    held_ = at::detail::empty_cuda({static_cast<int64_t>(bytes)}, options_);
    return held_.data_ptr();
  }

 private:
  at::TensorOptions options_;
  at::Tensor held_;
};

// x and y checked against each other and against the view; the view as the kernels take it.
inline View checked_view(const at::Tensor& x, const at::Tensor& y, at::IntArrayRef fields) {
  TORCH_CHECK(x.is_cuda() && y.is_cuda(), "normscan: x and y must be CUDA tensors");
  TORCH_CHECK(x.device() == y.device(), "normscan: x and y must be on one device");
  TORCH_CHECK(x.scalar_type() == y.scalar_type(), "normscan: x and y must have one dtype");
  TORCH_CHECK(fields.size() == View::kFields, "normscan: a view has ", num(View::kFields), " fields, got ",
              num(static_cast<int64_t>(fields.size())));
  const View v = View::from(fields.data());
  check_reach(x, v.x_so, v.x_sl, v.x_si, v, "x");
  check_reach(y, v.y_so, v.y_sl, v.y_si, v, "y");
  return v;
}

#ifndef NORMSCAN_FLOAT32_ONLY  // the fast path's; the exported files bind their family's entry alone
// A new contiguous tensor of x's shape, dtype and device: at::detail::empty_cuda, which skips
// the dispatcher, takes less host time a call than at::empty_like (docs/design-notes.md).
inline at::Tensor empty_contiguous_like(const at::Tensor& x) {
  return at::detail::empty_cuda(x.sizes(), x.scalar_type(), x.device(), std::nullopt);
}

// The eager call's common case, whole in C++ (the <family>_contiguous entries, the public
// functions' fast path: normscan/registry.py): x a contiguous CUDA tensor of a float dtype,
// dim in [-ndim, ndim), CUDA autocast off, no gradient wanted of x or `param`, which is None or a contiguous
// tensor of shape (x.size(dim),) on x's device, of x's dtype (or float32 beside a 16-bit x). Its view around dim, or nullopt
// where the call is not that case: the Python path then checks it, says what is wrong or
// copies what must be, and launches.
inline std::optional<View> contiguous_view(const at::Tensor& x, int64_t dim, const std::optional<at::Tensor>& param) {
  const auto type = x.scalar_type();
  const bool built = type == at::kFloat || type == at::kHalf || type == at::kBFloat16 || type == at::kDouble;
  const int64_t ndim = x.dim(), rank = ndim > 0 ? ndim : 1;
  if (!built || !x.is_cuda() || !x.is_contiguous() || dim < -rank || dim >= rank) return std::nullopt;
  // Under CUDA autocast (its dispatch key not excluded) the custom op casts as PyTorch's own op.
  if (!c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::AutocastCUDA)) return std::nullopt;
  const bool grad = at::GradMode::is_enabled();
  if (grad && x.requires_grad()) return std::nullopt;
  dim = dim < 0 ? dim + rank : dim;
  const int64_t length = ndim > 0 ? x.size(dim) : 1;
  const bool param_type = param && (param->scalar_type() == type ||
                                    ((type == at::kHalf || type == at::kBFloat16) && param->scalar_type() == at::kFloat));
  if (param && (param->device() != x.device() || !param_type || param->dim() != 1 ||
                param->size(0) != length || !param->is_contiguous() || (grad && param->requires_grad()))) {
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
