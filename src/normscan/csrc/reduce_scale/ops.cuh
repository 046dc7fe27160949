// Reduce-then-scale family: y = apply(x, scale(sum(map(x)))) [* w] [+ b] over one dim of a
// tensor seen as (outer, length, inner); apply is x * scale for the norms. The ops differ
// only in their functor.
#pragma once

#include <type_traits>

#include "../device/memory.cuh"
#include "../device/reduce.cuh"
#include "../device/view.cuh"

namespace normscan {

// A grouped op's channels and statistics (group_norm, instance_norm, batch_norm: x is
// (N, C, *) with a weight and bias per channel C). Element l of row r belongs to channel
// (r % groups) * (length / span) + l / span: a row is length / span channels of span
// elements each (group_norm's rows, one a (sample, group)), or one channel (span ==
// length: instance_norm's, one a (sample, channel)); a strided view's columns (o, i) are
// channels i (inner == groups). Rows r, r + stat_groups, r + 2 stat_groups, ... share one statistic
// (batch_norm's rows of one channel, one a sample; every row its own where stat_groups ==
// outer). `stats`, where not null, gets statistic g's mean and sum of squared deviations
// at stats[2g], stats[2g + 1] (the running statistics' update).
template <typename A> struct Grouping {
  int64_t groups, span, stat_groups;
  A* stats;
};

// P: the weight's and bias's element type, x's own or float32 for a 16-bit x (Fp32Params).
template <typename T, typename P = T> struct ReduceScaleArgs {
  const T* x;
  T* y;
  const P* w;  // optional, may be null: one weight per position along the reduced dim (a channel: kGrouped)
  const P* b;  // likewise a bias (kBiased ops)
  View view;
  double eps;
};
// A grouped op's: the others' kernels keep ReduceScaleArgs (32 bytes more of kernel
// parameters spilled the 16-bit RMSNorm and softmax row kernels, which sit at 64 registers).
template <typename T, typename P = T> struct GroupedArgs : ReduceScaleArgs<T, P> {
  Grouping<acc_t<T>> grouping;
};
// A kRowStats op's (layer_norm's): `stats`, where not null, gets row r's mean and the
// factor it scaled by (rstd: 1 / sqrt(var + eps)) at stats[2r], stats[2r + 1] (r in the
// view's order), which its backward reads instead of finding them again, as PyTorch's
// reads its saved mean and rstd.
template <typename T, typename P = T> struct RowStatsArgs : ReduceScaleArgs<T, P> {
  acc_t<T>* stats;
};

// map: what is summed; scale: the row's factor from that sum; apply: an element's output
// (x * scale for the norms); kWeighted, kBiased: whether the op takes a weight, a bias;
// kMaxShifted: the row's maximum m is found first and map and apply see x - m (softmax:
// exp(x - m) cannot overflow); kCentered: likewise the row's mean (layer_norm: map sums
// squared deviations); kGrouped: a weight and bias per channel, statistics shared across
// rows, written out (Grouping); kRowStats: each row's mean and rstd written out
// (RowStatsArgs) for its backward; kFusedBackward: backward.cuh serves the op, by its
// Gradient (below); kFusedRowForms: the op has the fused row forms (fused_rows.cuh: the
// residual add, out_dtype), and a backward that adds the gradient reaching h to dx.
// Param: the element type of its weight and bias where it is not x's (void: x's).
struct ReduceScaleTraits {
  static constexpr bool kWeighted = false, kBiased = false, kMaxShifted = false, kCentered = false,
                        kGrouped = false, kRowStats = false, kFusedBackward = false, kFusedRowForms = false;
  using Param = void;
};

// An op's fused backward (backward.cuh), over a row held on chip: with u = x less the row's
// shift (its maximum for kMaxShifted ops, its mean for kCentered ones; x itself otherwise),
// v = value<T>(u) (T: the row's dtype) and gw = g * w, the row's two sums of terms(v, gw),
// its coefficients coefs(sums, n, eps), then each element's dx = grad(v, gw, coefs); a
// weighted op's dw sums weight_grad(v, g, coefs) over the rows (and a biased op's db sums g).
//
// The norms, y = x * c(S) [* w] with S = sum(map(x)): dx = c * g * w + dc/dS * map'(x) * D,
// D = sum(g * w * x); each norm gives dc/dS * map'(x) as grad_coef(c, n) * dmap(x).
template <typename Op> struct ScaledGradient {
  template <typename T, typename A> static __device__ __forceinline__ A value(A x) { return x; }
  template <typename A> static __device__ __forceinline__ SumPair<A> terms(A x, A gw) { return {Op::map(x), gw * x}; }
  template <typename A> static __device__ __forceinline__ SumPair<A> coefs(SumPair<A> s, int64_t n, double eps) {
    const A c = Op::scale(s.a, n, eps);
    return {c, Op::grad_coef(c, n) * s.b};
  }
  template <typename A> static __device__ __forceinline__ A grad(A x, A gw, SumPair<A> k) {
    return k.a * gw + k.b * Op::dmap(x);
  }
  template <typename A> static __device__ __forceinline__ A weight_grad(A x, A g, SumPair<A> k) { return g * x * k.a; }
};
struct L2NormOp : ReduceScaleTraits {
  static constexpr bool kFusedBackward = true;
  using Gradient = ScaledGradient<L2NormOp>;
  template <typename A> static __device__ __forceinline__ A apply(A v, A scale) { return v * scale; }
  template <typename A> static __device__ __forceinline__ A map(A v) { return v * v; }
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t, double) {
    return A(1) / sqrt(s);
  }
  template <typename A> static __device__ __forceinline__ A dmap(A v) { return v; }
  template <typename A> static __device__ __forceinline__ A grad_coef(A c, int64_t) { return -c * c * c; }
};
struct L1NormOp : ReduceScaleTraits {
  static constexpr bool kFusedBackward = true;
  using Gradient = ScaledGradient<L1NormOp>;
  template <typename A> static __device__ __forceinline__ A apply(A v, A scale) { return v * scale; }
  template <typename A> static __device__ __forceinline__ A map(A v) { return fabs(v); }
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t n, double) {
    return A(1) / (s / A(n));
  }
  // sign(v), 0 at 0 (PyTorch's gradient of |v| there), NaN at NaN.
  template <typename A> static __device__ __forceinline__ A dmap(A v) { return v > A(0) ? A(1) : (v < A(0) ? A(-1) : v); }
  template <typename A> static __device__ __forceinline__ A grad_coef(A c, int64_t n) { return -c * c / A(n); }
};
struct RmsNormOp : ReduceScaleTraits {
  static constexpr bool kWeighted = true, kFusedBackward = true, kFusedRowForms = true;
  using Gradient = ScaledGradient<RmsNormOp>;
  template <typename A> static __device__ __forceinline__ A apply(A v, A scale) { return v * scale; }
  template <typename A> static __device__ __forceinline__ A map(A v) { return v * v; }
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t n, double eps) {
    return A(1) / sqrt(s / A(n) + A(eps));
  }
  template <typename A> static __device__ __forceinline__ A dmap(A v) { return v; }
  template <typename A> static __device__ __forceinline__ A grad_coef(A c, int64_t n) { return -c * c * c / A(n); }
};

// exp of x <= 0 (x - the row's maximum). fp32: ex2.approx of x * log2(e) (CUDA's __expf's
// error, 2 + 1.2 |x| ulp), results below 2**-126 flushed to 0: fewer instructions on rows
// that are issue-bound (measured: docs/tuning-record.md, exp-ftz).
template <typename A> __device__ __forceinline__ A exp_shifted(A x) {
  if constexpr (sizeof(A) == 4) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
  } else {
    return exp(x);
  }
}

// softmax: exp(x - m) / sum(exp(x - m)); log_softmax: (x - m) - log(sum(exp(x - m))). A row
// of -inf, or with +inf or NaN, gives NaN, as PyTorch's does. Their map must be exp: the
// kernels rescale partial sums to a larger maximum (MaxSumOp, device/reduce.cuh).
//
// exp of x <= 0 in the gradient of a T row: expf for fp32 (the gradient is held to twice
// PyTorch's error, and PyTorch's has y itself; __expf's 1.2 |x| ulp showed on rows of
// logits spread by 4: 13 ulp against 1), the fast one where T's rounding hides it.
template <typename T, typename A> __device__ __forceinline__ A exp_of(A x) {
  if constexpr (sizeof(T) == 2) return exp_shifted(x);
  else return exp(x);
}

// Their gradients, with e = exp(u), S = sum(e): softmax's dx = y * (g - sum(g * y)) =
// e / S * (g - T / S), T = sum(g * e); log_softmax's dx = g - exp(y) * sum(g) = g - e / S * G,
// G = sum(g). A row PyTorch's forward makes NaN gets NaN; an element of -inf gets 0 (softmax)
// or its g (log_softmax), as from PyTorch's y.
struct SoftmaxGradient {
  template <typename T, typename A> static __device__ __forceinline__ A value(A u) { return exp_of<T>(u); }
  template <typename A> static __device__ __forceinline__ SumPair<A> terms(A e, A g) { return {e, g * e}; }
  template <typename A> static __device__ __forceinline__ SumPair<A> coefs(SumPair<A> s, int64_t, double) {
    const A inv = A(1) / s.a;
    return {inv, s.b * inv};
  }
  template <typename A> static __device__ __forceinline__ A grad(A e, A g, SumPair<A> k) { return e * k.a * (g - k.b); }
};
struct LogSoftmaxGradient {
  template <typename T, typename A> static __device__ __forceinline__ A value(A u) { return exp_of<T>(u); }
  template <typename A> static __device__ __forceinline__ SumPair<A> terms(A e, A g) { return {e, g}; }
  template <typename A> static __device__ __forceinline__ SumPair<A> coefs(SumPair<A> s, int64_t, double) {
    return {A(1) / s.a, s.b};
  }
  template <typename A> static __device__ __forceinline__ A grad(A e, A g, SumPair<A> k) { return g - e * k.a * k.b; }
};
struct SoftmaxOp : ReduceScaleTraits {
  static constexpr bool kMaxShifted = true, kFusedBackward = true;
  using Gradient = SoftmaxGradient;
  template <typename A> static __device__ __forceinline__ A map(A u) { return exp_shifted(u); }
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t, double) { return A(1) / s; }
  template <typename A> static __device__ __forceinline__ A apply(A u, A scale) { return exp_shifted(u) * scale; }
};
struct LogSoftmaxOp : ReduceScaleTraits {
  static constexpr bool kMaxShifted = true, kFusedBackward = true;
  using Gradient = LogSoftmaxGradient;
  template <typename A> static __device__ __forceinline__ A map(A u) { return exp_shifted(u); }
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t, double) { return log(s); }
  template <typename A> static __device__ __forceinline__ A apply(A u, A scale) { return u - scale; }
};

// layer_norm's, with u = x - mean, r = 1 / sqrt(var + eps) and gw = g * w: PyTorch's
// dx = r * (gw - mean(gw) - xhat * mean(gw * xhat)), xhat = u * r, taken as
// r * gw + offset + slope * u; dw sums g * xhat over the rows, db sums g. The mean and r are
// the forward's (kRowStats, as PyTorch saves its mean and rstd): one exchange a row, of
// sum(gw) and sum(gw * u).
template <typename A> struct CenteredCoefs {
  A rstd, offset, slope;
};
template <typename Op> struct CenteredGradient {
  template <typename T, typename A> static __device__ __forceinline__ A value(A u) { return u; }
  template <typename A> static __device__ __forceinline__ SumPair<A> terms(A u, A gw) { return {gw, gw * u}; }
  template <typename A>
  static __device__ __forceinline__ CenteredCoefs<A> coefs(SumPair<A> s, A r, int64_t n) {
    const A inv_n = A(1) / A(n);
    return {r, -r * s.a * inv_n, -r * r * r * s.b * inv_n};
  }
  template <typename A> static __device__ __forceinline__ A grad(A u, A gw, CenteredCoefs<A> k) {
    return k.rstd * gw + k.offset + k.slope * u;
  }
  template <typename A> static __device__ __forceinline__ A weight_grad(A u, A g, CenteredCoefs<A> k) {
    return g * u * k.rstd;
  }
};

// layer_norm: (x - mean) / sqrt(var + eps) [* w] [+ b], var the biased variance (the mean
// of map(x - mean)), as F.layer_norm. Kernels that hold the row sum it first for the mean;
// those that read it twice merge each batch's mean and squared deviations (MeanM2).
struct LayerNormOp : ReduceScaleTraits {
  static constexpr bool kWeighted = true, kBiased = true, kCentered = true, kRowStats = true, kFusedBackward = true,
                        kFusedRowForms = true;
  using Gradient = CenteredGradient<LayerNormOp>;
  template <typename A> static __device__ __forceinline__ A apply(A v, A scale) { return v * scale; }
  template <typename A> static __device__ __forceinline__ A map(A v) { return v * v; }
  // rsqrt, as PyTorch's kernel (2 ulp in fp32); IEEE division and square root spilled the
  // strided kernel's 16 columns a thread.
  template <typename A> static __device__ __forceinline__ A scale(A s, int64_t n, double eps) {
    return rsqrt(ratio(s, A(n)) + A(eps));
  }
};

// group_norm, instance_norm, batch_norm: layer_norm's statistics over a grouped row or
// column, a weight and bias per channel (Grouping).
struct GroupNormOp : LayerNormOp {
  static constexpr bool kGrouped = true, kRowStats = false, kFusedBackward = false,  // not layer_norm's rows
                        kFusedRowForms = false;
};

// A weighted op whose weight and bias are float32 beside a 16-bit x, as mixed-precision
// training keeps its parameters: read as they are (no cast of them, no rounding of them to
// x's dtype), by kernels of their own.
template <typename Op> struct Fp32Params : Op {
  static_assert(Op::kWeighted, "only a weighted op takes parameters");
  using Param = float;
};
// The element type of an op's weight and bias beside an x of T.
template <typename T, typename Op>
using param_t = std::conditional_t<std::is_void<typename Op::Param>::value, T, typename Op::Param>;

// f(Op{}), or f(Fp32Params<Op>{}) where a weighted op's 16-bit x has float32 parameters.
template <typename T, typename Op, typename F> inline void with_param_type(bool fp32_params, F&& f) {
  if constexpr (Op::kWeighted && sizeof(T) == 2) {
    if (fp32_params) return f(Fp32Params<Op>{});
  }
  f(Op{});
}

// The arguments an op's kernels take.
template <typename T, typename Op, typename P = param_t<T, Op>>
using ArgsFor = std::conditional_t<Op::kGrouped, GroupedArgs<T, P>,
                                   std::conditional_t<Op::kRowStats, RowStatsArgs<T, P>, ReduceScaleArgs<T, P>>>;
// Whether an op's kernels write its statistics out (write_stat).
template <typename Op> constexpr bool kWritesStats = Op::kGrouped || Op::kRowStats;

// The family's ops by id: the ids normscan's registry (normscan/ops.py) passes, checked
// against this list by tests/test_build.py.
#ifndef NORMSCAN_REDUCE_SCALE_OPS  // an exported KernelBench file lists its one op itself
#define NORMSCAN_REDUCE_SCALE_OPS(X) \
  X(0, L2NormOp) X(1, L1NormOp) X(2, RmsNormOp) X(3, SoftmaxOp) X(4, LogSoftmaxOp) X(5, LayerNormOp) \
  X(6, GroupNormOp)
#endif
// The ops with out-dtype forms (out_binding.cu).
#define NORMSCAN_REDUCE_SCALE_OUT_OPS(X) X(2, RmsNormOp) X(5, LayerNormOp)

NORMSCAN_OP_VISITOR(with_reduce_scale_op, NORMSCAN_REDUCE_SCALE_OPS)

// Whether map and apply see x less a row's shift (its maximum or mean).
template <typename Op> constexpr bool kShifted = Op::kMaxShifted || Op::kCentered;

// The resident blocks a SM a kernel asks of the compiler: half for doubles of a max-shifted
// op, whose exp spills at the norms' register counts (the dispatchers give those no block of
// 1024 threads, which cannot have more than 64 registers), and on sm_80 for 16-bit softmax
// too (4 bytes spilled there in the cluster and strided kernels, none on sm_90).
template <typename T, typename Op> constexpr int min_blocks(int asked) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  constexpr bool kWide = kShifted<Op> && sizeof(T) != 4;
#else
  constexpr bool kWide = kShifted<Op> && sizeof(T) == 8;
#endif
  return kWide ? (asked + 1) / 2 : asked;
}

// An element's value as map and apply see it: x - shift for the shifted ops.
template <typename Op, typename A> __device__ __forceinline__ A shifted(A v, A shift) {
  if constexpr (kShifted<Op>) return v - shift;
  else return v;
}

// apply(x, scale) of one element, in the accumulator's type: y before any weight and bias.
template <typename Op, typename T>
__device__ __forceinline__ acc_t<T> scaled_value(T x, acc_t<T> scale, acc_t<T> shift) {
  return Op::apply(shifted<Op>(Convert<T>::to_acc(x), shift), scale);
}

// y = apply(x, scale) [* w] [+ b], one element.
template <typename Op, typename T, typename P>
__device__ __forceinline__ T scale_one(T x, acc_t<T> scale, acc_t<T> shift, const P* w, const P* b, int64_t l) {
  acc_t<T> v = scaled_value<Op>(x, scale, shift);
  if (w != nullptr) v *= Convert<P>::to_acc(w[l]);
  if constexpr (Op::kBiased) {
    if (b != nullptr) v += Convert<P>::to_acc(b[l]);
  }
  return Convert<T>::from_acc(v);
}

// The same with the weight and bias as values: w applied where WEIGHTED, b where `biased`.
template <typename Op, bool WEIGHTED, typename T>
__device__ __forceinline__ T scale_with(T x, acc_t<T> scale, acc_t<T> shift, acc_t<T> w, bool biased, acc_t<T> b) {
  acc_t<T> v = scaled_value<Op>(x, scale, shift);
  if constexpr (WEIGHTED) v *= w;
  if (biased) v += b;
  return Convert<T>::from_acc(v);
}

// V parameters from p, 16-byte aligned: one 16-byte load a 16 bytes (a float32 weight beside
// a 16-bit row's 8-element vector takes two).
template <typename P, int V> __device__ __forceinline__ Vec<P, V> load_params(const P* p) {
  constexpr int H = V * sizeof(P) > 16 ? 16 / sizeof(P) : V;  // elements a load
  if constexpr (H == V) {
    return load_vec<P, V>(p);
  } else {
    Vec<P, V> out;
#pragma unroll
    for (int i = 0; i < V; i += H) {
      const Vec<P, H> h = load_vec<P, H>(p + i);
#pragma unroll
      for (int j = 0; j < H; ++j) out.v[i + j] = h.v[j];
    }
    return out;
  }
}

// p's V elements from l (a weight's or bias's): 16-byte loads where they are aligned, V
// loads otherwise.
template <typename P, int V> __device__ __forceinline__ Vec<P, V> param_vec(const P* p, int64_t l) {
  if constexpr (V > 1) {
    if (reinterpret_cast<uintptr_t>(p + l) % 16 == 0) return load_params<P, V>(p + l);
  }
  Vec<P, V> v;
#pragma unroll
  for (int i = 0; i < V; ++i) v.v[i] = p[l + i];
  return v;
}

// y of V elements: apply(x, scale) [* wv where weighted] [+ bv where biased], their weight
// and bias loaded beforehand (param_vec).
template <typename Op, typename T, int V, typename P>
__device__ __forceinline__ Vec<T, V> scale_by(const Vec<T, V>& x, acc_t<T> scale, acc_t<T> shift, bool weighted,
                                              const Vec<P, V>& wv, bool biased, const Vec<P, V>& bv) {
  acc_t<T> v[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    v[i] = scaled_value<Op>(x.v[i], scale, shift);
    if (weighted) v[i] *= Convert<P>::to_acc(wv.v[i]);
    if constexpr (Op::kBiased) {
      if (biased) v[i] += Convert<P>::to_acc(bv.v[i]);
    }
  }
  return from_acc_vec<T, V>(v);
}

// y = apply(x, scale) * wc + bc of V elements of one channel (weight wc, bias bc).
template <typename Op, typename T, int V>
__device__ __forceinline__ Vec<T, V> scaled_in_channel(const Vec<T, V>& x, acc_t<T> scale, acc_t<T> shift, acc_t<T> wc,
                                                        acc_t<T> bc) {
  acc_t<T> v[V];
#pragma unroll
  for (int i = 0; i < V; ++i) v[i] = scaled_value<Op>(x.v[i], scale, shift) * wc + bc;
  return from_acc_vec<T, V>(v);
}

// A grouped op's weight and bias (of P) along one row: those of channel l / span of the row's
// channels, which start at w and b. WIDE: rows of 2**31 elements and more (64-bit
// divisions); rows held on chip are shorter (32-bit ones).
template <typename T, bool WIDE = false, typename P = T> struct ChannelRow {
  using Offset = std::conditional_t<WIDE, int64_t, uint32_t>;
  const P* w;
  const P* b;
  Offset span;

  static __device__ __forceinline__ ChannelRow at(const GroupedArgs<T, P>& a, int64_t row) {
    const int64_t first = (row % a.grouping.groups) * (a.view.length / a.grouping.span);
    return ChannelRow{a.w ? a.w + first : nullptr, a.b ? a.b + first : nullptr, static_cast<Offset>(a.grouping.span)};
  }
  __device__ __forceinline__ int64_t channel(int64_t l) const { return static_cast<Offset>(l) / span; }
  // y of element l: apply(x, scale) * w + b of its channel.
  template <typename Op>
  __device__ __forceinline__ T scale(T x, acc_t<T> scale, acc_t<T> shift, int64_t l) const {
    return scale_one<Op>(x, scale, shift, w, b, channel(l));
  }
  // The same for the V elements from l, whose channel is looked up once where they share one.
  template <typename Op, int V>
  __device__ __forceinline__ Vec<T, V> scale(const Vec<T, V>& x, acc_t<T> scale, acc_t<T> shift, int64_t l) const {
    using A = acc_t<T>;
    A v[V];
    const int64_t c = channel(l);
    if (static_cast<Offset>(l) - static_cast<Offset>(c) * span + V <= span)
      return scaled_in_channel<Op>(x, scale, shift, w ? Convert<P>::to_acc(w[c]) : A(1),
                                   b ? Convert<P>::to_acc(b[c]) : A(0));
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = Convert<T>::to_acc(this->scale<Op>(x.v[i], scale, shift, l + i));
    return from_acc_vec<T, V>(v);
  }
};

// A row's (a statistic's) factor and shift (rstd and mean for the centered ops).
template <typename A> struct RowScale {
  A scale, shift;
};

// Statistic `stat`'s mean, and its rstd or its sum of squared deviations m2, where asked: a
// grouped op's mean and m2 (Grouping), a kRowStats op's mean and rstd (RowStatsArgs).
template <typename A> __device__ __forceinline__ void write_pair(A* stats, int64_t stat, A first, A second) {
  if (stats != nullptr) {
    stats[2 * stat] = first;
    stats[2 * stat + 1] = second;
  }
}
template <typename T, typename P>
__device__ __forceinline__ void write_stat(const GroupedArgs<T, P>& a, int64_t stat, RowScale<acc_t<T>> rs, acc_t<T> m2) {
  write_pair(a.grouping.stats, stat, rs.shift, m2);
}
template <typename T, typename P>
__device__ __forceinline__ void write_stat(const RowStatsArgs<T, P>& a, int64_t stat, RowScale<acc_t<T>> rs, acc_t<T>) {
  write_pair(a.stats, stat, rs.shift, rs.scale);
}

}  // namespace normscan
