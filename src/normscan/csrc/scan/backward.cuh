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
// Rows of up to 1024 vectors are held by one block and read once. Longer ones are read in two
// passes over their chunks: forward, each chunk's product (the P before each chunk kept in
// shared memory); then backward from the last chunk (still in registers), x read again (from
// L2 when the row is recent) with g, dx written.
//
// Held rows take acc_t's arithmetic (fp32 for fp32, as PyTorch's); chunked ones scan_acc_t's
// (fp64 for fp32: in fp32 arithmetic, fp64 across the chunks or not, rows of 131080 erred 2-3x
// PyTorch's, over the tests' 2x). It is plain first (ComposeOp); a row with a non-finite dx is
// done again with ZeroSafeComposeOp, whose answer it then is.
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
// (f . h)(r) = f(h(r)), f nearer the row's start, and the step of one element (x, g), in
// plain arithmetic: where every value they meet is finite, these are ZeroSafeComposeOp's.
struct ComposeOp {
  template <typename P> static __device__ __forceinline__ P identity() { return P{1, 0}; }
  template <typename A> static __device__ __forceinline__ Affine<A> apply(Affine<A> f, Affine<A> h) {
    return Affine<A>{f.a * h.a, f.a * h.b + f.b};
  }
  template <typename A> static __device__ __forceinline__ Affine<A> step(A x, A g, bool exclusive) {
    return Affine<A>{x, exclusive ? g : x * g};
  }
};
// The same with 0 times anything 0: a constant f (a == 0) ignores h entirely (0 * NaN would
// carry a NaN past a zero), and an infinite f.a keeps h's zeros (the identity (1, 0) among
// them: the parallel scan composes it where a sequential one would not, and inf * 0 would be
// NaN).
struct ZeroSafeComposeOp : ComposeOp {
  template <typename A> static __device__ __forceinline__ Affine<A> apply(Affine<A> f, Affine<A> h) {
    if (f.a == A(0)) return f;
    return Affine<A>{h.a == A(0) ? A(0) : f.a * h.a, h.b == A(0) ? f.b : f.a * h.b + f.b};
  }
  template <typename A> static __device__ __forceinline__ Affine<A> step(A x, A g, bool exclusive) {
    return Affine<A>{x, exclusive ? g : (x == A(0) ? A(0) : x * g)};
  }
};
template <typename A> __device__ __forceinline__ Affine<A> shfl_down(Affine<A> v, int o) {
  return Affine<A>{shfl_down(v.a, o), shfl_down(v.b, o)};
}
template <typename A> __device__ __forceinline__ Affine<A> shfl_idx(Affine<A> v, int lane) {
  return Affine<A>{shfl_idx(v.a, lane), shfl_idx(v.b, lane)};
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
// asked, rows of up to MAXC chunks (the P before each is shared memory; 1: the held kernel).
template <int BLOCK, int NV, int MINB, int MAXC> struct CumprodBackwardConfig {
  static constexpr int kBlock = BLOCK, kVecs = NV, kMinBlocks = MINB, kMaxChunks = MAXC;
  static constexpr int64_t kChunkVecs = int64_t(BLOCK) * NV;
};

// Doubles hold twice the registers: half the resident blocks asked.
template <typename T> constexpr int cumprod_backward_min_blocks(int asked) { return sizeof(T) == 8 ? (asked + 1) / 2 : asked; }

// One chunk of a row's x and g in registers (warp-striped as ScanChunk's), and the pieces of
// its gradient: x's products within it, and its steps.
template <typename T, int V, typename Cfg, typename A> struct CumprodChunk {
  using F = Affine<A>;
  using X = ScanChunk<T, ProdOp, V, Cfg::kBlock, Cfg::kVecs, A>;
  static constexpr int NV = Cfg::kVecs, WARPS = X::WARPS;
  X x;  // x, and its products within the chunk
  Vec<T, V> g[NV];
  F after[NV];  // each vector's later steps within its warp's share
  F later;      // the steps of the chunk's later warps' shares
  F steps;      // the whole chunk's steps

  // x's products within the chunk, and its total (one barrier; `scratch` of WARPS entries).
  __device__ __forceinline__ void scan_products(int64_t first, int64_t nvec, A* scratch) {
    x.scan_warp(first, nvec);
    x.scan_block(scratch);
  }
  // The chunk's steps, with Op's arithmetic (one barrier; `scratch` of WARPS entries).
  template <typename Op> __device__ __forceinline__ void compose(int64_t first, int64_t nvec, bool exclusive, F* scratch) {
    const int lane = threadIdx.x % 32;
    F run = Op::template identity<F>();
#pragma unroll
    for (int k = NV - 1; k >= 0; --k) {
      F t = Op::template identity<F>();
      if (X::index(first, k) < nvec) {
#pragma unroll
        for (int e = V - 1; e >= 0; --e)
          t = Op::apply(Op::step(to_scan<T, A>(x.buf[k].v[e]), to_scan<T, A>(g[k].v[e]), exclusive), t);
      }
      const F inc = warp_inclusive_scan_down<Op>(t, lane);
      const F next = shfl_down(inc, 1);
      after[k] = Op::apply(lane == 31 ? Op::template identity<F>() : next, run);
      run = Op::apply(shfl_idx(inc, 0), run);
    }
    later = block_exclusive_scan_warps<Op, WARPS, true>(run, scratch, &steps);
  }
  // dx of the chunk, given the P before it and the steps of every later chunk; whether every
  // dx this thread wrote is finite.
  template <typename Op, typename Row>
  __device__ __forceinline__ bool write(const Row& rx, int64_t first, int64_t nvec, A before, F carry,
                                        bool exclusive, int64_t n) const {
    const F rest = Op::apply(later, carry);
    const A base = ProdOp::apply(before, x.warp_prefix);
    bool finite = true;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t j = X::index(first, k);
      if (j < nvec) {
        A pe[V];
        A q = ProdOp::apply(base, x.pre[k]);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          pe[e] = q;
          q = ProdOp::apply(q, to_scan<T, A>(x.buf[k].v[e]));
        }
        F s = Op::apply(after[k], rest);
        acc_t<T> d[V];
#pragma unroll
        for (int e = V - 1; e >= 0; --e) {
          const A xe = to_scan<T, A>(x.buf[k].v[e]), ge = to_scan<T, A>(g[k].v[e]);
          const A de = cumprod_grad(pe[e], xe, ge, s.b, exclusive, j * V + e == n - 1, n == 1);
          finite = finite && isfinite(de);
          d[e] = static_cast<acc_t<T>>(de);
          s = Op::apply(Op::step(xe, ge, exclusive), s);
        }
        rx.store(j, from_acc_vec<T, V>(d));
      }
    }
    return finite;
  }
};

// Vectors k < NV of the chunk at `first` of row r (those before nvec).
template <int NV, typename Chunk, typename Row, typename T, int V>
__device__ __forceinline__ void load_chunk(const Row& r, Vec<T, V>* v, int64_t first, int64_t nvec) {
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (Chunk::X::index(first, k) < nvec) v[k] = r.load(Chunk::X::index(first, k));
}

// Rows of several chunks: one block a row, two passes.
template <typename T, int V, typename Cfg>
__global__ void __launch_bounds__(Cfg::kBlock, cumprod_backward_min_blocks<T>(Cfg::kMinBlocks)) cumprod_backward_rows_kernel(CumprodBackwardArgs<T> a) {
  using A = scan_acc_t<T>;
  using F = Affine<A>;
  using Chunk = CumprodChunk<T, V, Cfg, A>;
  constexpr int NV = Cfg::kVecs;
  constexpr int64_t VECS = Chunk::X::VECS;
  __shared__ A products[2][Chunk::WARPS];
  __shared__ F steps[Chunk::WARPS];
  __shared__ A before[Cfg::kMaxChunks];  // P before each chunk
  const int64_t n = a.view.length;
  for (int64_t row = blockIdx.x; row < a.view.outer; row += gridDim.x) {
    const ScanRow<T, V> rx(a.x + row * a.view.x_so, a.dx + row * a.view.y_so, n, a.reverse);
    const ScanRow<T, V> rg(a.g + row * a.g_so, nullptr, n, a.reverse);
    const int64_t nvec = rx.s.nvec, chunks = ceil_div(nvec, VECS);
    // Each chunk's loads go out before the chunk before it is reduced (forward) or scanned
    // (backward), and the last chunk's g with its x: a chunk's barriers then wait on one DRAM
    // round trip at most, not two or three.
    Chunk c;
    load_chunk<NV, Chunk>(rx, c.x.buf, 0, nvec);
    int parity = 0;
    A p = ProdOp::identity<A>();
    for (int64_t i = 0; i + 1 < chunks; ++i, parity ^= 1) {
      Vec<T, V> next[NV];
      load_chunk<NV, Chunk>(rx, next, (i + 1) * VECS, nvec);
      if (i + 2 == chunks) load_chunk<NV, Chunk>(rg, c.g, (i + 1) * VECS, nvec);
      A t = ProdOp::identity<A>();
#pragma unroll
      for (int k = 0; k < NV; ++k) t = ProdOp::apply(t, combine<ProdOp, T, V, A>(c.x.buf[k]));  // not the last: whole
      t = block_group_reduce<ProdOp, Chunk::WARPS>(t, products[parity], 0, WarpPlace::of_thread());
      if (threadIdx.x == 0) before[i] = p;
      p = ProdOp::apply(p, t);
#pragma unroll
      for (int k = 0; k < NV; ++k) c.x.buf[k] = next[k];
    }
    if (threadIdx.x == 0) before[chunks - 1] = p;
    // The chunks backwards from the last, c holding it, with Op's arithmetic; whether every
    // dx this thread wrote is finite.
    const auto write_gradient = [&](auto op) {
      using Op = decltype(op);
      bool finite = true;
      F carry = Op::template identity<F>();  // the steps of every later chunk
      for (int64_t i = chunks - 1; i >= 0; --i, parity ^= 1) {
        const int64_t first = i * VECS;
        Vec<T, V> prev_x[NV], prev_g[NV];  // chunk i - 1
        if (i > 0) {
          load_chunk<NV, Chunk>(rx, prev_x, first - VECS, nvec);
          load_chunk<NV, Chunk>(rg, prev_g, first - VECS, nvec);
        }
        c.scan_products(first, nvec, products[parity]);
        c.template compose<Op>(first, nvec, a.exclusive, steps);
        finite = c.template write<Op>(rx, first, nvec, before[i], carry, a.exclusive, n) && finite;
        carry = Op::apply(c.steps, carry);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          c.x.buf[k] = prev_x[k];
          c.g[k] = prev_g[k];
        }
      }
      return finite;
    };
    // A finite dx met only finite values (inf and NaN are absorbing under + and *), so where
    // every dx is finite it is the zero-safe one.
    if (!__syncthreads_and(write_gradient(ComposeOp{}))) {
      load_chunk<NV, Chunk>(rx, c.x.buf, (chunks - 1) * VECS, nvec);
      load_chunk<NV, Chunk>(rg, c.g, (chunks - 1) * VECS, nvec);
      write_gradient(ZeroSafeComposeOp{});
    }
    __syncthreads();  // the next row rewrites `before` and the scratch
  }
}

// Rows of one chunk, held by one block: read once.
template <typename T, int V, typename Cfg>
__global__ void __launch_bounds__(Cfg::kBlock, cumprod_backward_min_blocks<T>(Cfg::kMinBlocks)) cumprod_backward_held_kernel(CumprodBackwardArgs<T> a) {
  using A = acc_t<T>;
  using F = Affine<A>;
  using Chunk = CumprodChunk<T, V, Cfg, A>;
  constexpr int NV = Cfg::kVecs;
  __shared__ A products[Chunk::WARPS];
  __shared__ F steps[Chunk::WARPS];
  const int64_t n = a.view.length;
  for (int64_t row = blockIdx.x; row < a.view.outer; row += gridDim.x) {
    const ScanRow<T, V> rx(a.x + row * a.view.x_so, a.dx + row * a.view.y_so, n, a.reverse);
    const ScanRow<T, V> rg(a.g + row * a.g_so, nullptr, n, a.reverse);
    const int64_t nvec = rx.s.nvec;
    Chunk c;
    load_chunk<NV, Chunk>(rx, c.x.buf, 0, nvec);
    load_chunk<NV, Chunk>(rg, c.g, 0, nvec);
    c.scan_products(0, nvec, products);
    const auto write_gradient = [&](auto op) {
      using Op = decltype(op);
      c.template compose<Op>(0, nvec, a.exclusive, steps);
      return c.template write<Op>(rx, 0, nvec, ProdOp::identity<A>(), Op::template identity<F>(), a.exclusive, n);
    };
    // As the chunked kernel: where every dx of the row is finite, it is the zero-safe one.
    if (!__syncthreads_and(write_gradient(ComposeOp{}))) write_gradient(ZeroSafeComposeOp{});
  }
}

}  // namespace normscan
