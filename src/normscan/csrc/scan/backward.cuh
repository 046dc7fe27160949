// cumprod's gradient over rows (inner == 1), one block a row. In scan order, with P_i the
// product of x_0 .. x_{i-1} and f_k(r) = a_k * r + b_k one step per element:
//   dx_i = P_i * (c_i + E_i),  E_i = (f_{i+1} . f_{i+2} . ... . f_{n-1})(0),
//   inclusive: a_k = x_k, b_k = x_k * g_k, c_i = g_i;  exclusive: a_k = x_k, b_k = g_k, c_i = 0.
// No division, so zeros need no formula of their own (PyTorch divides a reverse cumsum of
// g * y by x, and takes the first zero apart). Where PyTorch's formula is exact it is this
// one; its special cases are kept: 0 after the first zero (P_i == 0), NaN at an infinite or
// NaN x_i (its division there), g itself for one-element rows, and 0 for x's last element in
// an exclusive scan (it reaches no output). E is a composition of affine maps, so a step
// with a_k == 0 is constant and hides everything after it, NaN and infinity included, as
// PyTorch's masks do.
//
// Two passes over a row's chunks: forward, each chunk's product (the P before each chunk kept
// in shared memory); then backward from the last chunk (still in registers), x read again
// (from L2 when the row is recent) with g, dx written. A row of one chunk is read once.
#pragma once

#include "rows.cuh"

namespace normscan {

NORMSCAN_OP_VISITOR(with_scan_backward_op, NORMSCAN_SCAN_BACKWARD_OPS)

template <typename T> struct CumprodBackwardArgs {
  const T* x;
  const T* g;  // rows contiguous, g_so apart
  T* dx;       // laid out as the view's y
  View view;
  int64_t g_so;
  bool reverse, exclusive;
};

// r -> a * r + b.
template <typename A> struct Affine {
  A a, b;
};
// (f . h)(r) = f(h(r)), f nearer the row's start, with 0 times anything 0: a constant f
// (a == 0) ignores h entirely (0 * NaN would carry a NaN past a zero), and an infinite f.a
// keeps h's zeros (the identity (1, 0) among them: the parallel scan composes it where a
// sequential one would not, and inf * 0 would be NaN).
struct ComposeOp {
  template <typename P> static __device__ __forceinline__ P identity() { return P{1, 0}; }
  template <typename A> static __device__ __forceinline__ Affine<A> apply(Affine<A> f, Affine<A> h) {
    if (f.a == A(0)) return f;
    return Affine<A>{h.a == A(0) ? A(0) : f.a * h.a, h.b == A(0) ? f.b : f.a * h.b + f.b};
  }
};
template <typename A> __device__ __forceinline__ Affine<A> shfl_down(Affine<A> v, int o) {
  return Affine<A>{shfl_down(v.a, o), shfl_down(v.b, o)};
}
template <typename A> __device__ __forceinline__ Affine<A> shfl_idx(Affine<A> v, int lane) {
  return Affine<A>{shfl_idx(v.a, lane), shfl_idx(v.b, lane)};
}

// The step of one element (x, g).
template <typename A> __device__ __forceinline__ Affine<A> cumprod_step(A x, A g, bool exclusive) {
  return Affine<A>{x, exclusive ? g : (x == A(0) ? A(0) : x * g)};
}
// dx of one element from its P and E (see the top); `last`: the row's last element.
template <typename A>
__device__ __forceinline__ A cumprod_grad(A p, A x, A g, A e, bool exclusive, bool last, bool single) {
  if ((exclusive && last) || p == A(0)) return A(0);
  if (single) return g;
  if (!isfinite(x)) return A(NAN);
  return p * ((exclusive ? A(0) : g) + e);
}

// A configuration: BLOCK threads holding NV vectors each a chunk, MINB resident blocks a SM
// asked, rows of up to MAXC chunks (the P before each chunk is shared memory).
template <int BLOCK, int NV, int MINB, int MAXC> struct CumprodBackwardConfig {
  static constexpr int kBlock = BLOCK, kVecs = NV, kMinBlocks = MINB, kMaxChunks = MAXC;
  static constexpr int64_t kChunkVecs = int64_t(BLOCK) * NV;
};

template <typename T, int V, typename Cfg>
__global__ void __launch_bounds__(Cfg::kBlock, Cfg::kMinBlocks) cumprod_backward_rows_kernel(CumprodBackwardArgs<T> a) {
  using A = scan_acc_t<T>;
  using F = Affine<A>;
  using Chunk = ScanChunk<T, ProdOp, V, Cfg::kBlock, Cfg::kVecs>;  // x's chunk and its products
  constexpr int NV = Cfg::kVecs;
  __shared__ A products[2][Chunk::WARPS];
  __shared__ F steps[Chunk::WARPS];
  __shared__ A before[Cfg::kMaxChunks];  // P before each chunk
  const int lane = threadIdx.x % 32;
  const int64_t n = a.view.length;
  for (int64_t row = blockIdx.x; row < a.view.outer; row += gridDim.x) {
    const ScanRow<T, V> rx(a.x + row * a.view.x_so, a.dx + row * a.view.y_so, n, a.reverse);
    const ScanRow<T, V> rg(a.g + row * a.g_so, nullptr, n, a.reverse);
    const int64_t nvec = rx.s.nvec, chunks = ceil_div(nvec, Chunk::VECS);
    Chunk c;
    int parity = 0;
    A p = ProdOp::identity<A>();
    for (int64_t i = 0; i < chunks; ++i, parity ^= 1) {
      c.load(rx, i * Chunk::VECS, nvec);
      A t = ProdOp::identity<A>();
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (Chunk::index(i * Chunk::VECS, k) < nvec) t = ProdOp::apply(t, combine<ProdOp>(c.buf[k]));
      t = block_group_reduce<ProdOp, Chunk::WARPS>(t, products[parity], 0, WarpPlace::of_thread());
      if (threadIdx.x == 0) before[i] = p;
      p = ProdOp::apply(p, t);
    }
    F carry = ComposeOp::identity<F>();  // the steps of every later chunk
    for (int64_t i = chunks - 1; i >= 0; --i, parity ^= 1) {
      const int64_t first = i * Chunk::VECS;
      if (i != chunks - 1) c.load(rx, first, nvec);  // the last chunk is still held
      c.scan_warp(first, nvec);
      c.scan_block(products[parity]);
      Vec<T, V> gv[NV];
      F after[NV];  // each vector's later steps within the warp's share
      F run = ComposeOp::identity<F>();
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (Chunk::index(first, k) < nvec) gv[k] = rg.load(Chunk::index(first, k));
#pragma unroll
      for (int k = NV - 1; k >= 0; --k) {
        F t = ComposeOp::identity<F>();
        if (Chunk::index(first, k) < nvec) {
#pragma unroll
          for (int e = V - 1; e >= 0; --e)
            t = ComposeOp::apply(cumprod_step(to_scan<T>(c.buf[k].v[e]), to_scan<T>(gv[k].v[e]), a.exclusive), t);
        }
        const F inc = warp_inclusive_scan_down<ComposeOp>(t, lane);
        const F next = shfl_down(inc, 1);
        after[k] = ComposeOp::apply(lane == 31 ? ComposeOp::identity<F>() : next, run);
        run = ComposeOp::apply(shfl_idx(inc, 0), run);
      }
      F chunk_steps;
      const F later = ComposeOp::apply(block_exclusive_scan_warps<ComposeOp, Chunk::WARPS, true>(run, steps, &chunk_steps),
                                       carry);
      const A base = ProdOp::apply(before[i], c.warp_prefix);
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int64_t j = Chunk::index(first, k);
        if (j < nvec) {
          A pe[V];
          A q = ProdOp::apply(base, c.pre[k]);
#pragma unroll
          for (int e = 0; e < V; ++e) {
            pe[e] = q;
            q = ProdOp::apply(q, to_scan<T>(c.buf[k].v[e]));
          }
          F s = ComposeOp::apply(after[k], later);
          Vec<T, V> out;
#pragma unroll
          for (int e = V - 1; e >= 0; --e) {
            const A xe = to_scan<T>(c.buf[k].v[e]), ge = to_scan<T>(gv[k].v[e]);
            out.v[e] = from_scan<T>(cumprod_grad(pe[e], xe, ge, s.b, a.exclusive, j * V + e == n - 1, n == 1));
            s = ComposeOp::apply(cumprod_step(xe, ge, a.exclusive), s);
          }
          rx.store(j, out);
        }
      }
      carry = ComposeOp::apply(chunk_steps, carry);
    }
    __syncthreads();  // the next row rewrites `before` and the scratch
  }
}

}  // namespace normscan
