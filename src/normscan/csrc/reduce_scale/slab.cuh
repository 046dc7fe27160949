// Slabs read twice: y = apply(x, scale(sum over each column)) [* w] over the middle dim of an
// (outer, length, inner) view whose (length, inner) block per outer (a slab) is contiguous,
// with few columns: inner a power of two, at most 32 vectors a position (a (batch, time,
// features) tensor normalised over time, with few features). The strided kernels lay their
// threads along inner, so with one or two column vectors 1/32 to 1/8 of them have work, and
// each column takes one block (8 blocks of 8 working threads for (8, 2**20, 4)). Here a slab
// is one flat row whose element e is column e % inner's, read in whole 16-byte vectors and
// split across blocks as reread.cuh's rows are: a pass that sums, then a pass that scales.
//
// A thread's vectors are those of one index modulo CV = inner / M (tiles, parts and spans
// start at multiples of CV), M = min(inner, V): element i of each is column cv * M + i % M.
// So a thread keeps M running statistics (RowAccumulator), joined across the lanes and warps
// of the same cv.
// - reduce_scale_slab_warp_kernel: one warp a short slab (a block's warps take one each: a
//   block a slab of 256 vectors spent its time in the block's barriers).
// - reduce_scale_slab_reread_kernel: one block a slab, for slabs enough to fill the GPU (the
//   second read partly from L2).
// - reduce_scale_slab_sum_kernel, then reduce_scale_slab_scale_kernel: a slab summed by
//   `parts` blocks (part p: tiles p, p + parts, ...), each writing its column statistics,
//   then scaled by spans of a tile, the last first (the last read, in L2), each block
//   merging its slab's parts column by column in one order (the same bits in every block).
#pragma once

#include "reread.cuh"

namespace normscan {

// The ops the slab kernels serve: one statistic a column, no bias, no pilot (a centered op
// measures from each column's first element) and no channels.
template <typename Op> constexpr bool kSlabOp = !Op::kCentered && !Op::kBiased && !Op::kGrouped;

// A split of slabs across blocks (as RowSplitting for rows), with the slab's vectors and CV
// (cv_shift = log2 CV).
struct SlabSplitting {
  int64_t nvec, parts, spans, span;
  int cv_shift;
};

template <int BLOCK> constexpr int64_t kSlabTile = int64_t(BLOCK) * kRereadUnroll;  // vectors

template <typename T, typename Op> constexpr int slab_min_blocks() { return min_blocks<T, Op>(4); }

// Adds the vectors of thread t of the GROUP threads that read [begin, end) of the slab at xs
// (begin a multiple of CV) to its column statistics, kRereadUnroll vectors a thread at a time.
template <typename T, typename Op, int GROUP, int M>
__device__ __forceinline__ void slab_add(const T* xs, int64_t begin, int64_t end, int t,
                                         RowAccumulator<Op, acc_t<T>> (&acc)[M]) {
  constexpr int V = vec16<T>(), U = kRereadUnroll, P = V / M;  // P: positions a vector
  for (int64_t j = begin + t; j < end; j += int64_t(GROUP) * U) {
    Vec<T, V> v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (j + u * GROUP < end) v[u] = load_vec<T, V>(xs + (j + u * GROUP) * V);
    const int n = static_cast<int>(min64(U, (end - j + GROUP - 1) / GROUP)) * P;  // present values a column
#pragma unroll
    for (int m = 0; m < M; ++m) {
      acc_t<T> vals[U * P];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int p = 0; p < P; ++p) vals[u * P + p] = Convert<T>::to_acc(v[u].v[p * M + m]);
      acc[m].add(vals, n);
    }
  }
}

// Joins the column statistics s of a warp's lanes of the same cv: every lane gets its cv's.
template <typename Op, int M, typename Stat> __device__ __forceinline__ void slab_warp_join(Stat (&s)[M], int cvs) {
#pragma unroll
  for (int m = 0; m < M; ++m)
    for (int o = 16; o >= cvs; o >>= 1) s[m] = RowStatOp<Op>::apply(s[m], shfl_xor(s[m], o));
}

// Joins every thread's column statistics s into the block's, column c's handed to
// done(c, statistic) by thread c. scratch: a row of 32 * M a warp. Ends past a barrier.
template <typename Op, int BLOCK, int M, typename Stat, typename Done>
__device__ __forceinline__ void slab_join(Stat (&s)[M], int cvs, Stat (*scratch)[32 * M], Done&& done) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  slab_warp_join<Op, M>(s, cvs);
  if (lane < cvs) {
#pragma unroll
    for (int m = 0; m < M; ++m) scratch[warp][lane * M + m] = s[m];
  }
  __syncthreads();
  if (threadIdx.x < cvs * M) {
    Stat r = RowStatOp<Op>::template identity<Stat>();
#pragma unroll
    for (int w = 0; w < BLOCK / 32; ++w) r = RowStatOp<Op>::apply(r, scratch[w][threadIdx.x]);
    done(static_cast<int>(threadIdx.x), r);
  }
}

// The cv of thread t's vectors in slab_scale over [begin, end).
__device__ __forceinline__ int slab_scale_cv(int64_t end, int t, int cv_shift) {
  return static_cast<int>((end - 1 - t) & ((1 << cv_shift) - 1));
}

// Scales the vectors of thread t of the GROUP threads that scale [begin, end) of the slab at xs
// into ys (begin and end multiples of CV), walking back from the end; sc[m] and sh[m] are the
// factor and shift of its vectors' column slot m (their cv: slab_scale_cv); the weight by
// position along the reduced dim.
template <typename T, typename Op, int GROUP, int M>
__device__ __forceinline__ void slab_scale(const ArgsFor<T, Op>& a, const T* xs, T* ys, int64_t begin, int64_t end,
                                           int t, int cv_shift, const acc_t<T> (&sc)[M], const acc_t<T> (&sh)[M]) {
  constexpr int V = vec16<T>(), U = kRereadUnroll, P = V / M;
  using A = acc_t<T>;
  with_flag(a.w != nullptr, [&](auto weighted) {
    constexpr bool WEIGHTED = decltype(weighted)::value;
    for (int64_t j = end - 1 - t; j >= begin; j -= int64_t(GROUP) * U) {
      Vec<T, V> v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (j - u * GROUP >= begin) v[u] = load_vec<T, V>(xs + (j - u * GROUP) * V);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t k = j - u * GROUP;
        if (k < begin) continue;
        const int64_t l = (k >> cv_shift) * P;  // the vector's first position along the reduced dim
        Vec<T, V> out;
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const A w = WEIGHTED ? Convert<T>::to_acc(a.w[l + i / M]) : A(1);
          out.v[i] = scale_with<Op, WEIGHTED>(v[u].v[i], sc[i % M], sh[i % M], w, false, A(0));
        }
        store_vec<T, V>(ys + k * V, out);
      }
    }
  });
}

// Column c's factor and shift from its statistic into scale[c], shift[c].
template <typename T, typename Op>
__device__ __forceinline__ void slab_column_scale(const ArgsFor<T, Op>& a, int c, RowStat<Op, acc_t<T>> stat,
                                                  acc_t<T>* scale, acc_t<T>* shift) {
  const RowScale<acc_t<T>> rs = row_scale<Op, acc_t<T>>(stat, a.view.length, a.eps, acc_t<T>(0));
  scale[c] = rs.scale;
  shift[c] = rs.shift;
}

// Scales a block's vectors [begin, end) of a slab, its columns' factors and shifts in shared memory.
template <typename T, typename Op, int BLOCK, int M>
__device__ __forceinline__ void slab_block_scale(const ArgsFor<T, Op>& a, int64_t o, int64_t begin, int64_t end,
                                                 int cv_shift, const acc_t<T>* scale, const acc_t<T>* shift) {
  const int t = threadIdx.x, cv = slab_scale_cv(end, t, cv_shift);
  acc_t<T> sc[M], sh[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    sc[m] = scale[cv * M + m];
    sh[m] = shift[cv * M + m];
  }
  slab_scale<T, Op, BLOCK, M>(a, a.x + o * a.view.x_so, a.y + o * a.view.y_so, begin, end, t, cv_shift, sc, sh);
}

template <typename T, typename Op, int BLOCK, int M>
__global__ void __launch_bounds__(BLOCK, (slab_min_blocks<T, Op>()))
    reduce_scale_slab_warp_kernel(ArgsFor<T, Op> a, SlabSplitting s) {
  static_assert(kSlabOp<Op>, "an op the slab kernels serve");
  using A = acc_t<T>;
  using Stat = RowStat<Op, A>;
  constexpr int WARPS = BLOCK / 32;
  const int lane = threadIdx.x % 32, cvs = 1 << s.cv_shift;
  for (int64_t o = int64_t(blockIdx.x) * WARPS + threadIdx.x / 32; o < a.view.outer; o += int64_t(gridDim.x) * WARPS) {
    RowAccumulator<Op, A> acc[M];
    slab_add<T, Op, 32, M>(a.x + o * a.view.x_so, 0, s.nvec, lane, acc);
    Stat st[M];
#pragma unroll
    for (int m = 0; m < M; ++m) st[m] = acc[m].stat();
    slab_warp_join<Op, M>(st, cvs);  // lane l holds cv l % cvs's; it scales those of cv
    const int from = slab_scale_cv(s.nvec, lane, s.cv_shift);
    A sc[M], sh[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const RowScale<A> rs = row_scale<Op, A>(st[m], a.view.length, a.eps, A(0));
      sc[m] = shfl_idx(rs.scale, from);
      sh[m] = shfl_idx(rs.shift, from);
    }
    slab_scale<T, Op, 32, M>(a, a.x + o * a.view.x_so, a.y + o * a.view.y_so, 0, s.nvec, lane, s.cv_shift, sc, sh);
  }
}

template <typename T, typename Op, int BLOCK, int M>
__global__ void __launch_bounds__(BLOCK, (slab_min_blocks<T, Op>()))
    reduce_scale_slab_reread_kernel(ArgsFor<T, Op> a, SlabSplitting s) {
  static_assert(kSlabOp<Op>, "an op the slab kernels serve");
  using A = acc_t<T>;
  using Stat = RowStat<Op, A>;
  __shared__ Stat scratch[BLOCK / 32][32 * M];
  __shared__ A s_scale[32 * M], s_shift[32 * M];
  const int cvs = 1 << s.cv_shift;
  for (int64_t o = blockIdx.x; o < a.view.outer; o += gridDim.x) {
    RowAccumulator<Op, A> acc[M];
    slab_add<T, Op, BLOCK, M>(a.x + o * a.view.x_so, 0, s.nvec, threadIdx.x, acc);
    Stat st[M];
#pragma unroll
    for (int m = 0; m < M; ++m) st[m] = acc[m].stat();
    slab_join<Op, BLOCK, M>(st, cvs, scratch, [&](int c, Stat r) { slab_column_scale<T, Op>(a, c, r, s_scale, s_shift); });
    __syncthreads();
    slab_block_scale<T, Op, BLOCK, M>(a, o, 0, s.nvec, s.cv_shift, s_scale, s_shift);
    __syncthreads();  // every factor read before the next slab's
  }
}

template <typename T, typename Op, int BLOCK, int M>
__global__ void __launch_bounds__(BLOCK, (slab_min_blocks<T, Op>()))
    reduce_scale_slab_sum_kernel(ArgsFor<T, Op> a, SlabSplitting s, RowStat<Op, acc_t<T>>* stats) {
  static_assert(kSlabOp<Op>, "an op the slab kernels serve");
  constexpr int64_t TILE = kSlabTile<BLOCK>;
  using A = acc_t<T>;
  using Stat = RowStat<Op, A>;
  __shared__ Stat scratch[BLOCK / 32][32 * M];
  const int cvs = 1 << s.cv_shift;
  const int64_t columns = a.view.inner;
  for (int64_t u = blockIdx.x; u < a.view.outer * s.parts; u += gridDim.x) {
    const T* xs = a.x + u / s.parts * a.view.x_so;
    RowAccumulator<Op, A> acc[M];
    for (int64_t t = u % s.parts; t * TILE < s.nvec; t += s.parts)
      slab_add<T, Op, BLOCK, M>(xs, t * TILE, min64((t + 1) * TILE, s.nvec), threadIdx.x, acc);
    Stat st[M];
#pragma unroll
    for (int m = 0; m < M; ++m) st[m] = acc[m].stat();
    slab_join<Op, BLOCK, M>(st, cvs, scratch, [&](int c, Stat r) { stats[u * columns + c] = r; });
    __syncthreads();  // scratch read before the next unit's
  }
}

template <typename T, typename Op, int BLOCK, int M>
__global__ void __launch_bounds__(BLOCK, (slab_min_blocks<T, Op>()))
    reduce_scale_slab_scale_kernel(ArgsFor<T, Op> a, SlabSplitting s, const RowStat<Op, acc_t<T>>* stats) {
  static_assert(kSlabOp<Op>, "an op the slab kernels serve");
  using A = acc_t<T>;
  using Stat = RowStat<Op, A>;
  __shared__ Stat merged[BLOCK];
  __shared__ A s_scale[32 * M], s_shift[32 * M];
  const int columns = static_cast<int>(a.view.inner), per = BLOCK / columns;  // threads a column
  const int c = threadIdx.x % columns, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // After the lanes' merge, the entries of a column in `merged`: a warp's (fewer than 32
  // columns) or a thread's. One thread folding 128 entries in turn (two exps each for a
  // softmax) took most of a block's time at 2 columns.
  const int entries = columns < 32 ? BLOCK / 32 : per;
  const int64_t units = a.view.outer * s.spans;
  for (int64_t i = blockIdx.x; i < units; i += gridDim.x) {
    const int64_t u = units - 1 - i, o = u / s.spans, span = u % s.spans;
    // Thread k * columns + c merges column c of parts k, k + per, ...; then the lanes of a
    // column, then thread c the entries, each in one order.
    Stat r = RowStatOp<Op>::template identity<Stat>();
    for (int64_t k = threadIdx.x / columns; k < s.parts; k += per)
      r = RowStatOp<Op>::apply(r, stats[(o * s.parts + k) * columns + c]);
    for (int off = 16; off >= columns; off >>= 1) r = RowStatOp<Op>::apply(r, shfl_xor(r, off));
    if (columns >= 32) merged[threadIdx.x] = r;
    else if (lane < columns) merged[warp * columns + lane] = r;
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < columns) {
      r = RowStatOp<Op>::template identity<Stat>();
      for (int k = 0; k < entries; ++k) r = RowStatOp<Op>::apply(r, merged[k * columns + c]);
      slab_column_scale<T, Op>(a, c, r, s_scale, s_shift);
    }
    __syncthreads();
    slab_block_scale<T, Op, BLOCK, M>(a, o, span * s.span, min64((span + 1) * s.span, s.nvec), s.cv_shift, s_scale,
                                      s_shift);
  }
}

}  // namespace normscan
