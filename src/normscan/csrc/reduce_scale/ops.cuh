// Reduce-then-scale family: y = x * scale(sum(map(x))) [* w] over one dim of a tensor seen
// as (outer, length, inner). The ops differ only in their functor.
#pragma once

#include "../device/view.cuh"

namespace normscan {

template <typename T> struct ReduceScaleArgs {
  const T* x;
  T* y;
  const T* w;  // optional, may be null: one weight per position along the reduced dim
  View view;
  double eps;
};

// map: what is summed; scale: the factor every element of the row is multiplied by;
// kWeighted: whether the op takes a weight. For the backward (backward.cuh), with
// c = scale(S) and S = sum(map(x)): dx = c * g * w + grad_coef(c, n) * D * dmap(x), where
// D = sum(g * w * x) and grad_coef(c, n) * dmap(x) = dc/dS * map'(x).
struct L2NormOp {
  static constexpr bool kWeighted = false;
  template <typename A> static __device__ __forceinline__ A map(A v) { return v * v; }
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t, double) {
    return A(1) / sqrt(s);
  }
  template <typename A> static __device__ __forceinline__ A dmap(A v) { return v; }
  template <typename A> static __device__ __forceinline__ A grad_coef(A c, int64_t) { return -c * c * c; }
};
struct L1NormOp {
  static constexpr bool kWeighted = false;
  template <typename A> static __device__ __forceinline__ A map(A v) { return fabs(v); }
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t n, double) {
    return A(1) / (s / A(n));
  }
  // sign(v), 0 at 0 (PyTorch's gradient of |v| there), NaN at NaN.
  template <typename A> static __device__ __forceinline__ A dmap(A v) { return v > A(0) ? A(1) : (v < A(0) ? A(-1) : v); }
  template <typename A> static __device__ __forceinline__ A grad_coef(A c, int64_t n) { return -c * c / A(n); }
};
struct RmsNormOp {
  static constexpr bool kWeighted = true;
  template <typename A> static __device__ __forceinline__ A map(A v) { return v * v; }
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t n, double eps) {
    return A(1) / sqrt(s / A(n) + A(eps));
  }
  template <typename A> static __device__ __forceinline__ A dmap(A v) { return v; }
  template <typename A> static __device__ __forceinline__ A grad_coef(A c, int64_t n) { return -c * c * c / A(n); }
};

// The family's ops by id: the ids normscan's registry (normscan/ops.py) passes, checked
// against this list by tests/test_registry.py.
#ifndef NORMSCAN_REDUCE_SCALE_OPS  // an exported KernelBench file lists its one op itself
#define NORMSCAN_REDUCE_SCALE_OPS(X) X(0, L2NormOp) X(1, L1NormOp) X(2, RmsNormOp)
#endif

NORMSCAN_OP_VISITOR(with_reduce_scale_op, NORMSCAN_REDUCE_SCALE_OPS)

// y = x * scale [* w], one element.
template <typename T>
__device__ __forceinline__ T scale_one(T x, acc_t<T> scale, const T* w, int64_t l) {
  acc_t<T> v = Convert<T>::to_acc(x) * scale;
  if (w != nullptr) v *= Convert<T>::to_acc(w[l]);
  return Convert<T>::from_acc(v);
}

}  // namespace normscan
