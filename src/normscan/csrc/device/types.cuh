// Element types: the accumulator each element type sums in, conversions to and from it,
// 16-byte vectors of elements, and 64-bit index helpers. No torch, no fp16 headers (device/half.cuh adds those).
#pragma once

#include <cuda_runtime.h>
#include <cstdint>
#include <type_traits>

namespace normscan {

// Accumulate 16- and 32-bit floats in fp32, doubles in fp64.
template <typename T> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };
template <typename T> using acc_t = typename AccType<T>::type;

// Element <-> accumulator conversion. 16-bit types specialise this in device/half.cuh.
template <typename T> struct Convert {
  static __device__ __forceinline__ acc_t<T> to_acc(T v) { return static_cast<acc_t<T>>(v); }
  static __device__ __forceinline__ T from_acc(acc_t<T> v) { return static_cast<T>(v); }
  // Two values rounded into out[0], out[1] (16-bit types round both in one instruction).
  static __device__ __forceinline__ void from_acc2(acc_t<T> lo, acc_t<T> hi, T* out) {
    out[0] = from_acc(lo);
    out[1] = from_acc(hi);
  }
};

// Pairs of 16-bit elements in one 32-bit register (device/half.cuh defines them for fp16
// and bf16): max, the lane-wise maximum in T itself, a NaN winning; low and high, the two
// elements widened to fp32.
template <typename T> struct Pairs;

// Clusters of up to 16 blocks: more than 8 (sm_90's portable limit) is opted into per kernel.
constexpr int kMaxCluster = 16, kMaxPortableCluster = 8;

// What an output element type is: FP8's (device/fp8.cuh) is scaled and saturated to kMax,
// its largest finite value.
template <typename O> struct OutFormat {
  static constexpr bool kFp8 = false;
};

// Elements per 16-byte vector.
template <typename T> __host__ __device__ constexpr int vec16() { return static_cast<int>(16 / sizeof(T)); }

template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// N accumulator values rounded to a vector of T, in pairs (16-byte vectors hold 2, 4 or 8
// elements; scalar kernels take vectors of 1).
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> from_acc_vec(const acc_t<T> (&v)[N]) {
  static_assert(N == 1 || N % 2 == 0, "whole pairs, or one element");
  Vec<T, N> out;
  if constexpr (N == 1) {
    out.v[0] = Convert<T>::from_acc(v[0]);
  } else {
#pragma unroll
    for (int i = 0; i < N; i += 2) Convert<T>::from_acc2(v[i], v[i + 1], &out.v[i]);
  }
  return out;
}

// A family's ops are an X-macro list of (id, functor), X(0, SumOp) ...; this defines
// `bool NAME(int64_t op, F&& f)`, which calls f(Functor{}) for the functor of id `op` and
// returns false where the list has none, or where NORMSCAN_ONLY_OPS (a mask of ids: bit id
// set, the op built) leaves it out: normscan/_build.py builds each op's kernels apart, a
// fraction of a whole family's build time.
#ifndef NORMSCAN_ONLY_OPS
#define NORMSCAN_ONLY_OPS (~0ull)
#endif
#define NORMSCAN_VISIT_CASE(id, Op)                               \
  case id:                                                        \
    if constexpr ((((NORMSCAN_ONLY_OPS) >> (id)) & 1ull) != 0) { \
      f(Op{});                                                    \
      return true;                                                \
    } else {                                                      \
      return false;                                               \
    }
#define NORMSCAN_OP_VISITOR(NAME, LIST)                         \
  template <typename F>                                         \
  inline bool NAME(int64_t op, F&& f) {                         \
    switch (op) { LIST(NORMSCAN_VISIT_CASE) }                   \
    return false;                                               \
  }

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
__host__ __device__ inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// f(std::true_type{}) or f(std::false_type{}): a launch-wide flag as a constant inside a
// loop, where as a value it costs a select on every element.
template <typename F> __device__ __forceinline__ void with_flag(bool flag, F&& f) {
  if (flag) f(std::true_type{});
  else f(std::false_type{});
}

}  // namespace normscan
