// Associative operators, and reductions over a warp and over groups of warps of a block.
#pragma once

#include <type_traits>

#include "types.cuh"

namespace normscan {

// kCostly: a combine is dear (block_group_reduce then shares a group's combines across lanes).
struct SumOp {
  static constexpr bool kCostly = false;
  template <typename A> static __device__ __forceinline__ A identity() { return A(0); }
  template <typename A> static __device__ __forceinline__ A apply(A a, A b) { return a + b; }
};
// A NaN wins (unlike fmax's), so that it reaches every result that depends on it.
// ONE_INSTRUCTION: fp32 as max.NaN (sm_80+), two instructions fewer than the comparisons;
// the forward's issue-bound 16-bit rows take it, the fp32 softmax backward keeps the
// comparisons (measured: docs/tuning-record.md, max-nan).
template <bool ONE_INSTRUCTION> struct MaxOf {
  static constexpr bool kCostly = false;
  template <typename A> static __device__ __forceinline__ A identity() { return -A(INFINITY); }
  template <typename A> static __device__ __forceinline__ A apply(A a, A b) {
    if constexpr (ONE_INSTRUCTION && sizeof(A) == 4) {
      A m;
      asm("max.NaN.f32 %0, %1, %2;" : "=f"(m) : "f"(a), "f"(b));
      return m;
    } else {
      return a > b || a != a ? a : b;
    }
  }
};
using MaxOp = MaxOf<true>;
using CompareMaxOp = MaxOf<false>;
// The maximum of acc and a vector's elements. 16-bit ones a pair at a time in their own type,
// widened once (Pairs): 7 instructions for 8 bf16 elements, where widening each and taking
// its maximum is 16.
template <typename T, int V> __device__ __forceinline__ acc_t<T> vec_max(const Vec<T, V>& v, acc_t<T> acc) {
  if constexpr (sizeof(T) == 2 && V == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(&v);
    const uint32_t p = Pairs<T>::max(Pairs<T>::max(u.x, u.y), Pairs<T>::max(u.z, u.w));
    return MaxOp::apply(MaxOp::apply(acc, Pairs<T>::low(p)), Pairs<T>::high(p));
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) acc = MaxOp::apply(acc, Convert<T>::to_acc(v.v[i]));
    return acc;
  }
}
struct ProdOp {
  static constexpr bool kCostly = false;
  template <typename A> static __device__ __forceinline__ A identity() { return A(1); }
  template <typename A> static __device__ __forceinline__ A apply(A a, A b) { return a * b; }
};

// Two sums taken together (a backward's row statistics), so that a block needs one barrier
// for both.
template <typename A> struct SumPair {
  A a, b;
};
struct SumPairOp {
  static constexpr bool kCostly = false;
  template <typename P> static __device__ __forceinline__ P identity() { return P{0, 0}; }
  template <typename A> static __device__ __forceinline__ SumPair<A> apply(SumPair<A> x, SumPair<A> y) {
    return SumPair<A>{x.a + y.a, x.b + y.b};
  }
};

// The maximum m of some values and the sum s of exp(value - m) over them (0 while m is
// -inf: every value was -inf): a softmax's row statistics, combined across threads.
template <typename A> struct MaxSum {
  A max, sum;
};
// exp(x - m) terms rescaled to the larger maximum. A NaN or a +inf maximum gives a NaN sum,
// as the terms themselves would.
struct MaxSumOp {
  static constexpr bool kCostly = true;  // two exps
  template <typename P> static __device__ __forceinline__ P identity() {
    return P{MaxOp::identity<decltype(P::max)>(), 0};
  }
  template <typename A> static __device__ __forceinline__ MaxSum<A> apply(MaxSum<A> a, MaxSum<A> b) {
    const A m = MaxOp::apply(a.max, b.max);
    return MaxSum<A>{m, rescaled(a, m) + rescaled(b, m)};
  }
  // p's sum as terms exp(x - m), for a maximum m >= p.max.
  template <typename A> static __device__ __forceinline__ A rescaled(MaxSum<A> p, A m) {
    return p.max == MaxOp::identity<A>() ? A(0) : p.sum * exp(p.max - m);
  }
};

// a / b for counts and sums: fp32 by the fast division (2 ulp; the IEEE one's slow path
// made layer_norm's kernels spill).
template <typename A> __device__ __forceinline__ A ratio(A a, A b) {
  if constexpr (sizeof(A) == 4) return __fdividef(a, b);
  else return a / b;
}

// The count n of some values, their mean, and m2, the sum of their squared deviations from
// it: a layer norm's row statistics, merged (Chan, Golub and LeVeque) without the
// cancellation of a sum of squares less a squared sum.
template <typename A> struct MeanM2 {
  A n, mean, m2;
};
struct MeanM2Op {
  static constexpr bool kCostly = true;  // a division
  template <typename P> static __device__ __forceinline__ P identity() { return P{0, 0, 0}; }
  template <typename A> static __device__ __forceinline__ MeanM2<A> apply(MeanM2<A> a, MeanM2<A> b) {
    const A n = a.n + b.n;
    if (b.n == A(0)) return a;
    if (a.n == A(0)) return b;
    const A d = b.mean - a.mean, f = ratio(b.n, n);
    return MeanM2<A>{n, a.mean + d * f, a.m2 + b.m2 + d * d * a.n * f};
  }
};

constexpr unsigned kFullMask = 0xffffffffu;

template <typename A> __device__ __forceinline__ A shfl_xor(A v, int o) { return __shfl_xor_sync(kFullMask, v, o); }
template <typename A> __device__ __forceinline__ A shfl_down(A v, int o) { return __shfl_down_sync(kFullMask, v, o); }
template <typename A> __device__ __forceinline__ A shfl_idx(A v, int lane) { return __shfl_sync(kFullMask, v, lane); }
template <typename A> __device__ __forceinline__ MaxSum<A> shfl_xor(MaxSum<A> v, int o) {
  return MaxSum<A>{shfl_xor(v.max, o), shfl_xor(v.sum, o)};
}

template <typename A> __device__ __forceinline__ SumPair<A> shfl_xor(SumPair<A> v, int o) {
  return SumPair<A>{shfl_xor(v.a, o), shfl_xor(v.b, o)};
}
template <typename A> __device__ __forceinline__ MeanM2<A> shfl_xor(MeanM2<A> v, int o) {
  return MeanM2<A>{shfl_xor(v.n, o), shfl_xor(v.mean, o), shfl_xor(v.m2, o)};
}

// Op over the 32 lanes of a warp; every lane gets the result, the same bits on every lane.
// MaxSum pairs: the maximum first, then each lane's sum rescaled to it once and the sums
// added, one exp a lane where a MaxSumOp a step takes two (ten in all: a 16-bit softmax row
// of 32 elements a thread spent more instructions on its reductions' exps than on its own).
// MeanM2 moments likewise: the count and the mean first (sums of n and n * mean), then each
// lane's m2 + n (mean - the mean)^2 added (Chan's merge of all lanes at once), one division
// a lane where a MeanM2Op a step takes one and three shuffles.
template <typename Op, typename A>
__device__ __forceinline__ A warp_reduce(A v) {
  if constexpr (std::is_same<Op, MaxSumOp>::value) {
    const auto m = warp_reduce<MaxOp>(v.max);
    return A{m, warp_reduce<SumOp>(MaxSumOp::rescaled(v, m))};
  } else if constexpr (std::is_same<Op, MeanM2Op>::value) {
    using S = decltype(v.n);
    const S n = warp_reduce<SumOp>(v.n), total = warp_reduce<SumOp>(v.n * v.mean);
    const S mean = n == S(0) ? S(0) : ratio(total, n), d = v.mean - mean;
    return A{n, mean, warp_reduce<SumOp>(v.n == S(0) ? S(0) : v.m2 + v.n * d * d)};
  } else {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, shfl_xor(v, o));
    return v;
  }
}

// Op over the block's v, every thread getting it: each warp's, then the warps' in order.
template <typename Op, typename A> __device__ __forceinline__ A block_reduce_in_order(A v, A* scratch) {
  v = warp_reduce<Op>(v);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  A total = Op::template identity<A>();
  const int warps = blockDim.x / 32;
  for (int i = 0; i < warps; ++i) total = Op::apply(total, scratch[i]);
  __syncthreads();  // before scratch is written again
  return total;
}
template <typename A> __device__ __forceinline__ A block_sum_in_order(A v, A* scratch) {
  return block_reduce_in_order<SumOp>(v, scratch);
}

// Where a thread sits in its block: its lane and its warp.
struct WarpPlace {
  int lane, warp;
  static __device__ __forceinline__ WarpPlace of_thread() {
    return WarpPlace{static_cast<int>(threadIdx.x % 32), static_cast<int>(threadIdx.x / 32)};
  }
};

// The barrier where a reduction's warps meet: the whole block's, or a named one that only a
// group of its warps takes (a warp-specialised kernel's groups, which run apart).
struct BlockBarrier {
  __device__ __forceinline__ void sync() const { __syncthreads(); }
};
template <int ID, int THREADS> struct GroupBarrier {
  static_assert(ID > 0 && ID < 16 && THREADS % 32 == 0, "a named barrier (0 is __syncthreads') of whole warps");
  __device__ __forceinline__ void sync() const { asm volatile("bar.sync %0, %1;" ::"n"(ID), "n"(THREADS) : "memory"); }
};

// Op over v of a group of GROUP_WARPS consecutive warps of the block, starting at warp
// `first` (a row's warps, or the whole block); every thread of the group gets the result,
// combined in warp order. `scratch` has one entry per warp of the block. One barrier
// (`bar`, which the group's warps alone may take) when GROUP_WARPS > 1: callers alternate
// two scratch buffers, or meet at another barrier before the next call writes.
template <typename Op, int GROUP_WARPS, typename A, typename Barrier = BlockBarrier>
__device__ __forceinline__ A block_group_reduce(A v, A* scratch, int first, WarpPlace me, const Barrier& bar = Barrier{}) {
  v = warp_reduce<Op>(v);
  if (GROUP_WARPS > 1) {
    if (me.lane == 0) scratch[me.warp] = v;
    bar.sync();
    if constexpr (Op::kCostly) {  // each lane takes one warp's value, then the warp reduces
      v = me.lane < GROUP_WARPS ? scratch[first + me.lane] : Op::template identity<A>();
      v = warp_reduce<Op>(v);
    } else {
      v = Op::template identity<A>();
#pragma unroll
      for (int i = 0; i < GROUP_WARPS; ++i) v = Op::apply(v, scratch[first + i]);
    }
  }
  return v;
}
template <int GROUP_WARPS, typename A>
__device__ __forceinline__ A block_group_sum(A v, A* scratch, int first, WarpPlace me) {
  return block_group_reduce<SumOp, GROUP_WARPS>(v, scratch, first, me);
}

}  // namespace normscan
