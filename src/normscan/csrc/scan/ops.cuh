// Scan family: inclusive or exclusive, forward or reverse scans with an associative op
// over one dim of a tensor seen as (outer, length, inner).
//
// The running value is kept in scan_acc_t<T>: fp32 for 16-bit types, as PyTorch does; fp64
// for fp32 and fp64. A product's rounding error grows with the number of multiplications
// on its path, and a parallel scan has more of them than PyTorch's mostly-sequential one:
// with an fp32 running value fp32 cumprod measured 2.7x PyTorch's error (docs/design-notes.md); in
// fp64 it is one final rounding.
#pragma once

#include <type_traits>

#include "../device/reduce.cuh"
#include "../device/view.cuh"

namespace normscan {

template <typename T> struct ScanArgs {
  const T* x;
  T* y;
  View view;
  bool reverse;    // scan from the last element to the first
  bool exclusive;  // y[i] combines x[0..i) instead of x[0..i]
};
// A masked op's: the others' kernels keep ScanArgs (8 bytes more of parameters moved the
// look-back kernel's code).
template <typename T, typename M> struct MaskedScanArgs : ScanArgs<T> {
  const M* mask;  // one mask element an x element, with x's strides
};

// The sum of x * mask (masked_cumsum), x * mask never materialised: a bool mask read as bytes
// (x times 1 or 0, as PyTorch's x * mask gives it: inf and NaN times 0 are NaN), or a mask
// of x's dtype, which multiplies x (KernelBench's evaluator hands its bool mask over as
// float32). The binding picks MaskedBy<the mask's element> for the listed MaskedSumOp.
struct MaskedSumOp : SumOp {
  using Mask = uint8_t;
};
template <typename M> struct MaskedBy : MaskedSumOp {
  using Mask = M;
};
template <typename Op> constexpr bool kMasked = std::is_base_of<MaskedSumOp, Op>::value;
// The arguments an op's kernels take.
template <typename T, typename Op, bool = kMasked<Op>> struct ScanArgsOf { using type = ScanArgs<T>; };
template <typename T, typename Op> struct ScanArgsOf<T, Op, true> { using type = MaskedScanArgs<T, typename Op::Mask>; };
template <typename T, typename Op> using ScanArgsFor = typename ScanArgsOf<T, Op>::type;
// The mask's element type of a masked op's kernels (void: none).
template <typename Op, bool = kMasked<Op>> struct MaskOf { using type = void; };
template <typename Op> struct MaskOf<Op, true> { using type = typename Op::Mask; };
template <typename Op> using mask_t = typename MaskOf<Op>::type;

// The resident blocks a SM a scan kernel asks of the compiler: half for masked scans but fp32
// with a bool mask on sm_90 (KernelBench 93's), whose mask pointer and unpacking spilled
// 8-48 bytes at the unmasked counts (16-bit and double rows and strided columns, fp32 rows
// on sm_80, and with a float mask).
template <typename T, typename Op> constexpr int scan_min_blocks(int asked) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  constexpr bool kWide = kMasked<Op>;
#else
  constexpr bool kWide = kMasked<Op> && (sizeof(T) != 4 || !std::is_same_v<mask_t<Op>, uint8_t>);  // not sizeof(void)
#endif
  return kWide ? (asked + 1) / 2 : asked;
}

// The family's ops by id: the ids normscan's registry (normscan/ops.py) passes, checked
// against this list by tests/test_build.py.
#ifndef NORMSCAN_SCAN_OPS  // an exported KernelBench file lists its one op itself
#define NORMSCAN_SCAN_OPS(X) X(0, ProdOp) X(1, SumOp) X(2, MaskedSumOp)
#endif

NORMSCAN_OP_VISITOR(with_scan_op, NORMSCAN_SCAN_OPS)

// The ops with a backward kernel (scan_backward, backward.cuh), under their ids above:
// cumprod's. cumsum's gradient is the forward's reverse scan.
#define NORMSCAN_SCAN_BACKWARD_OPS(X) X(0, ProdOp)

template <typename T> struct ScanAccType { using type = acc_t<T>; };
template <> struct ScanAccType<float> { using type = double; };
template <typename T> using scan_acc_t = typename ScanAccType<T>::type;

template <typename T, typename A = scan_acc_t<T>>
__device__ __forceinline__ A to_scan(T v) { return static_cast<A>(Convert<T>::to_acc(v)); }
template <typename T>
__device__ __forceinline__ T from_scan(scan_acc_t<T> v) { return Convert<T>::from_acc(static_cast<acc_t<T>>(v)); }

// x times its mask element, rounded once to T: the value x * mask has in PyTorch (a bool's
// 1 or 0 exact).
template <typename T> __device__ __forceinline__ T masked(T v, uint8_t m) {
  return Convert<T>::from_acc(Convert<T>::to_acc(v) * acc_t<T>(m != 0));
}
template <typename T> __device__ __forceinline__ T masked(T v, T m) {
  return Convert<T>::from_acc(Convert<T>::to_acc(v) * Convert<T>::to_acc(m));
}
// N mask elements as loaded from m (aligned to the N of them: the dispatcher's condition
// for vectors). Up to 8 bytes are held as one integer until applied: held as a vector of
// bytes, each load was taken apart at once, and a kernel waited for every load in turn.
template <typename M, int N> struct LoadedMask {
  using Values = Vec<M, N>;
  using Held = std::conditional_t<sizeof(Values) == 1, uint8_t,
               std::conditional_t<sizeof(Values) == 2, uint16_t,
               std::conditional_t<sizeof(Values) == 4, uint32_t,
               std::conditional_t<sizeof(Values) == 8, uint64_t, Values>>>>;
  Held held;
  static __device__ __forceinline__ LoadedMask load(const M* m) { return {*reinterpret_cast<const Held*>(m)}; }
  __device__ __forceinline__ Values values() const {
    Values v;
    memcpy(&v, &held, sizeof v);
    return v;
  }
};
template <int N> struct LoadedMask<void, N> {};  // an unmasked op's: none
// A vector's N values times their N mask elements.
template <typename T, typename M, int N>
__device__ __forceinline__ Vec<T, N> masked_vec(Vec<T, N> v, const Vec<M, N>& ms) {
#pragma unroll
  for (int i = 0; i < N; ++i) v.v[i] = masked(v.v[i], ms.v[i]);
  return v;
}

// All N values of a vector combined, in the running value's type A.
template <typename Op, typename T, int N, typename A = scan_acc_t<T>>
__device__ __forceinline__ A combine(const Vec<T, N>& in) {
  A t = Op::template identity<A>();
#pragma unroll
  for (int i = 0; i < N; ++i) t = Op::apply(t, to_scan<T, A>(in.v[i]));
  return t;
}

// One element of a scan: `out` (when `write`) gets the running value after v (inclusive)
// or before it (exclusive); returns the running value after v.
template <typename Op, typename T>
__device__ __forceinline__ scan_acc_t<T> scan_step(scan_acc_t<T> v, scan_acc_t<T> run, bool exclusive, bool write,
                                                   T& out) {
  if (exclusive && write) out = from_scan<T>(run);
  run = Op::apply(run, v);
  if (!exclusive && write) out = from_scan<T>(run);
  return run;
}

// Writes the scan of a vector's values starting from `run`; returns the running value
// after them. Inclusive: out[i] = run . v[0..i]; exclusive: out[i] = run . v[0..i).
template <typename Op, typename T, int N>
__device__ __forceinline__ scan_acc_t<T> scan_items(const Vec<T, N>& in, Vec<T, N>* out, scan_acc_t<T> run, bool exclusive) {
#pragma unroll
  for (int i = 0; i < N; ++i) run = scan_step<Op, T>(to_scan<T>(in.v[i]), run, exclusive, true, out->v[i]);
  return run;
}

}  // namespace normscan
