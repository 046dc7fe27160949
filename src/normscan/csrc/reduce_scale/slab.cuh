// Slabs read twice: y = apply(x, scale(sum over each column)) [* w] over the middle dim of an
// (outer, length, inner) view with few columns (2 to 1024: a (batch, time, features) tensor
// normalised over time); a slab is one outer's (length, inner) block. The strided kernels lay
// their threads along inner, so with one or two column vectors 1/32 to 1/8 of them have work,
// and each column tile takes one block (8 blocks of 8 working threads for (8, 2**20, 4); 2
// blocks for (1, 2**20, 256)). Here a slab is one flat row whose element e is column e %
// inner's, read in W-element vectors (16-byte ones where the slab is contiguous, inner is a
// multiple of V or a power of two below it and the slabs hold whole vectors; else single
// elements, read where they lie: a slice of the columns, or every other one) and split across
// blocks as reread.cuh's rows are: a pass that sums, then a pass that scales.
//
// A thread's vectors are those of one index modulo CV = inner / M, M = min(inner, W): a
// block's threads step by `stride`, the most of them a multiple of CV (the others idle), and tiles,
// parts and spans start at multiples of CV. Element i of each is column cv * M + i % M.
// So a thread keeps M running statistics (RowAccumulator), joined across the threads of the
// same cv.
// - reduce_scale_slab_warp_kernel: one warp a short slab (a block's warps take one each: a
//   block a slab of 256 vectors spent its time in the block's barriers); CV a power of two.
// - reduce_scale_slab_reread_kernel: one block a slab, for slabs enough to fill the GPU (the
//   second read partly from L2).
// - reduce_scale_slab_sum_kernel, reduce_scale_slab_merge_kernel, then
//   reduce_scale_slab_scale_kernel: a slab summed by `parts` blocks (part p: tiles p, p +
//   parts, ...), each writing its column statistics; each column's parts merged by a block;
//   then scaled by spans of tiles, the last first (the last read, in L2).
#pragma once

#include "reread.cuh"

namespace normscan {

// The ops the slab kernels serve: one statistic a column, no bias, no pilot (a centered op
// measures from each column's first element) and no channels.
template <typename Op> constexpr bool kSlabOp = !Op::kCentered && !Op::kBiased && !Op::kGrouped;

// A slab as its kernels walk it (vectors of W elements), and its split across blocks (as
// RowSplitting for rows): cvs vectors a position, `stride` threads of a block at work (a
// multiple of cvs), tiles of stride * slab_unroll(W) vectors.
struct SlabSplitting {
  int64_t nvec, parts, spans, span;
  int cvs, stride;
};

// Vectors a thread has in flight: kRereadUnroll 16-byte ones, or SlabPolicy::kElementUnroll
// single elements (measured: docs/tuning-record.md, slab-element-unroll).
__host__ __device__ constexpr int slab_unroll(int w) { return w > 1 ? kRereadUnroll : SlabPolicy::kElementUnroll; }

// Blocks a SM: a block not all at work (WHOLE false) keeps its stride at run time, and at 4
// three 16-bit kernels of 8 column slots spilled 4 bytes.
template <typename T, typename Op, bool WHOLE = true> constexpr int slab_min_blocks() {
  return min_blocks<T, Op>(WHOLE ? 4 : 3);
}
// A block's threads at work: all of them where CV divides BLOCK (WHOLE), then a constant to
// the compiler (as a run-time value, three 16-bit kernels of 8 column slots spilled 4 bytes
// at 4 blocks a SM).
template <int BLOCK, bool WHOLE> __device__ __forceinline__ int slab_stride(const SlabSplitting& s) {
  return WHOLE ? BLOCK : s.stride;
}
// The most columns: fp32's 256 vectors a position, one to each thread of a block.
constexpr int kSlabMaxColumns = 1024;

// Adds vectors of x's slab at xs to thread t's (t < stride) column statistics: from begin +
// t, slab_unroll(W) vectors `stride` apart, then as many again `jump` further on (begin,
// stride and jump multiples of CV). Vector j lies at j * W (a slab of vectors is contiguous);
// single element j at (j / CV) * sl + (j % CV) * si, x's strides along the dim and inner.
template <typename T, typename Op, int W, int M>
__device__ __forceinline__ void slab_add(const ArgsFor<T, Op>& a, const SlabSplitting& s, const T* xs, int64_t begin,
                                         int64_t jump, int t, int stride, RowAccumulator<Op, acc_t<T>> (&acc)[M]) {
  constexpr int U = slab_unroll(W), P = W / M;  // P: positions a vector
  const int64_t end = s.nvec, sl = a.view.x_sl, si = a.view.x_si;
  const int cvs = s.cvs;
  // Single elements: element j's offset, and those between a thread's elements (stride and
  // jump apart).
  const int64_t apart = stride / cvs * sl, leap = jump / cvs * sl;
  int64_t at = W > 1 ? 0 : (begin / cvs + t / cvs) * sl + t % cvs * si;
  for (int64_t j = begin + t; j < end; j += jump, at += leap) {
    Vec<T, W> v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (j + u * stride < end) v[u] = load_vec<T, W>(W > 1 ? xs + (j + u * stride) * W : xs + at + u * apart);
    const int64_t left = end - j;
    int n = P;  // present values a column (the present vectors are the first ones)
#pragma unroll
    for (int u = 1; u < U; ++u) n += left > int64_t(u) * stride ? P : 0;
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

// Folds entries[e], e < n, into column e % columns, each column's entries in one order, and
// hands column c's statistic to done(c, statistic) on thread c % BLOCK: up to 8 threads a
// column and then one where half the block holds the columns, else a thread a column. Called
// by every thread of the block past a barrier after the entries were written; spare holds
// BLOCK entries. It holds at most one barrier: callers meet at another before either buffer is
// written again.
template <typename Op, int BLOCK, typename Stat, typename Done>
__device__ __forceinline__ void fold_columns(const Stat* entries, int n, int columns, Stat* spare, Done&& done) {
  const int t = threadIdx.x, per = n / columns, cap = BLOCK / columns;
  const int f = max(1, min(min(per, cap), 8));  // folders a column
  if (f == 1) {
    for (int c = t; c < columns; c += BLOCK) {
      Stat r = RowStatOp<Op>::template identity<Stat>();
      for (int e = c; e < n; e += columns) r = RowStatOp<Op>::apply(r, entries[e]);
      done(c, r);
    }
    return;
  }
  Stat r = RowStatOp<Op>::template identity<Stat>();
  if (t < f * columns) {
    for (int e = t; e < n; e += f * columns) r = RowStatOp<Op>::apply(r, entries[e]);
    spare[t] = r;
  }
  __syncthreads();
  if (t < columns) {
    r = RowStatOp<Op>::template identity<Stat>();
    for (int k = 0; k < f; ++k) r = RowStatOp<Op>::apply(r, spare[k * columns + t]);
    done(t, r);
  }
}

// Joins the column statistics s of a warp's lanes of the same cv (CV a power of two): every
// lane gets its cv's.
template <typename Op, int M, typename Stat> __device__ __forceinline__ void slab_warp_join(Stat (&s)[M], int cvs) {
#pragma unroll
  for (int m = 0; m < M; ++m)
    for (int o = 16; o >= cvs; o >>= 1) s[m] = RowStatOp<Op>::apply(s[m], shfl_xor(s[m], o));
}

// Joins every thread's column statistics s (threads at or past `stride` hold none) into the
// block's, column c's handed to done(c, statistic) by thread c % BLOCK: a power-of-two CV up to 32
// across a warp's lanes first, then the warps' (BLOCK / 32 * inner entries); else the
// threads' (stride * M entries). spare: BLOCK. As fold_columns, callers meet at a barrier
// before the buffers are written again.
template <typename Op, int BLOCK, int M, typename Stat, typename Done>
__device__ __forceinline__ void slab_join(Stat (&s)[M], int cvs, int stride, Stat* entries, Stat* spare, Done&& done) {
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  int n = 0;  // entries, entry e of column e % (cvs * M)
  if ((cvs & (cvs - 1)) == 0 && cvs <= 32) {  // a warp's lanes of a cv first
    slab_warp_join<Op, M>(s, cvs);
    if (lane < cvs) {
#pragma unroll
      for (int m = 0; m < M; ++m) entries[(warp * cvs + lane) * M + m] = s[m];
    }
    n = BLOCK / 32 * cvs * M;
  } else {  // a thread's
    if (t < stride) {
#pragma unroll
      for (int m = 0; m < M; ++m) entries[t * M + m] = s[m];
    }
    n = stride * M;
  }
  __syncthreads();
  fold_columns<Op, BLOCK>(entries, n, cvs * M, spare, done);
}

// Scales the vectors of thread t (< stride) of the threads that scale [begin, end) of slab o,
// `stride` vectors apart (begin, end and stride multiples of CV), walking back from the end;
// sc[m] and sh[m] are the factor and shift of its vectors' column slot m (their cv: (end - 1 -
// t) % CV); the weight by position along the reduced dim. Vectors and single elements lie as
// slab_add reads them (y's single elements by y's strides).
template <typename T, typename Op, int W, int M>
__device__ __forceinline__ void slab_scale(const ArgsFor<T, Op>& a, const SlabSplitting& s, int64_t o, int64_t begin,
                                           int64_t end, int t, int stride, const acc_t<T> (&sc)[M],
                                           const acc_t<T> (&sh)[M]) {
  constexpr int U = slab_unroll(W), P = W / M;
  using A = acc_t<T>;
  const int cvs = s.cvs;
  const T* xs = a.x + o * a.view.x_so;
  T* ys = a.y + o * a.view.y_so;
  auto walk = [&](auto weighted) {
    constexpr bool WEIGHTED = decltype(weighted)::value;
    const int64_t step = stride / cvs * P;  // positions between a thread's vectors
    int64_t j = end - 1 - t, l = j / cvs * P;  // l: vector j's first position along the reduced dim
    // Single elements (P = 1, l = j / CV): element j's offsets in x and y, and those between a
    // thread's.
    const int64_t x_apart = step * a.view.x_sl, y_apart = step * a.view.y_sl;
    const int64_t cv = j - l * cvs;
    int64_t xo = W > 1 ? 0 : l * a.view.x_sl + cv * a.view.x_si, yo = W > 1 ? 0 : l * a.view.y_sl + cv * a.view.y_si;
    for (; j >= begin; j -= int64_t(stride) * U, l -= step * U, xo -= x_apart * U, yo -= y_apart * U) {
      Vec<T, W> v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (j - u * stride >= begin)
          v[u] = load_vec<T, W>(W > 1 ? xs + (j - u * stride) * W : xs + xo - u * x_apart);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (j - u * stride < begin) continue;
        Vec<T, W> out;
#pragma unroll
        for (int i = 0; i < W; ++i) {
          const A w = WEIGHTED ? Convert<param_t<T, Op>>::to_acc(a.w[l - u * step + i / M]) : A(1);
          out.v[i] = scale_with<Op, WEIGHTED>(v[u].v[i], sc[i % M], sh[i % M], w, false, A(0));
        }
        store_vec<T, W>(W > 1 ? ys + (j - u * stride) * W : ys + yo - u * y_apart, out);
      }
    }
  };
  // Only a weighted op's kernels take the weight's path (softmax's 16-bit scaling kernels
  // spilled 12 bytes with it).
  if constexpr (Op::kWeighted) with_flag(a.w != nullptr, walk);
  else walk(std::false_type{});
}

// Column c's factor and shift from its statistic into scale[c], shift[c].
template <typename T, typename Op>
__device__ __forceinline__ void slab_column_scale(const ArgsFor<T, Op>& a, int c, RowStat<Op, acc_t<T>> stat,
                                                  acc_t<T>* scale, acc_t<T>* shift) {
  const RowScale<acc_t<T>> rs = row_scale<Op, acc_t<T>>(stat, a.view.length, a.eps, acc_t<T>(0));
  scale[c] = rs.scale;
  shift[c] = rs.shift;
}

// Scales a block's vectors [begin, end) of slab o, its columns' factors and shifts in shared memory.
template <typename T, typename Op, int BLOCK, int W, int M, bool WHOLE>
__device__ __forceinline__ void slab_block_scale(const ArgsFor<T, Op>& a, const SlabSplitting& s, int64_t o,
                                                 int64_t begin, int64_t end, const acc_t<T>* scale,
                                                 const acc_t<T>* shift) {
  const int t = threadIdx.x, stride = slab_stride<BLOCK, WHOLE>(s);
  if (t >= stride) return;
  const int cv = static_cast<int>((end - 1 - t) % s.cvs);
  acc_t<T> sc[M], sh[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    sc[m] = scale[cv * M + m];
    sh[m] = shift[cv * M + m];
  }
  slab_scale<T, Op, W, M>(a, s, o, begin, end, t, stride, sc, sh);
}

// Shared memory of the block kernels: the joins' entries (a warp's inner of them, CV <= 32,
// or a thread's M: at most BLOCK * M), then each column's factor and shift.
template <typename A, typename Stat, int BLOCK, int M> struct SlabShared {
  Stat entries[BLOCK * M], spare[BLOCK];
  A scale[kSlabMaxColumns], shift[kSlabMaxColumns];
};

template <typename T, typename Op, int BLOCK, int W, int M>
__global__ void __launch_bounds__(BLOCK, (slab_min_blocks<T, Op>()))
    reduce_scale_slab_warp_kernel(ArgsFor<T, Op> a, SlabSplitting s) {
  static_assert(kSlabOp<Op>, "an op the slab kernels serve");
  using A = acc_t<T>;
  using Stat = RowStat<Op, A>;
  constexpr int WARPS = BLOCK / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t o = int64_t(blockIdx.x) * WARPS + threadIdx.x / 32; o < a.view.outer; o += int64_t(gridDim.x) * WARPS) {
    RowAccumulator<Op, A> acc[M];
    slab_add<T, Op, W, M>(a, s, a.x + o * a.view.x_so, 0, 32 * slab_unroll(W), lane, 32, acc);
    Stat st[M];
#pragma unroll
    for (int m = 0; m < M; ++m) st[m] = acc[m].stat();
    slab_warp_join<Op, M>(st, s.cvs);  // lane l holds cv l % CV's; it scales those of cv
    const int from = static_cast<int>((s.nvec - 1 - lane) & (s.cvs - 1));
    A sc[M], sh[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const RowScale<A> rs = row_scale<Op, A>(st[m], a.view.length, a.eps, A(0));
      sc[m] = shfl_idx(rs.scale, from);
      sh[m] = shfl_idx(rs.shift, from);
    }
    slab_scale<T, Op, W, M>(a, s, o, 0, s.nvec, lane, 32, sc, sh);
  }
}

template <typename T, typename Op, int BLOCK, int W, int M, bool WHOLE>
__global__ void __launch_bounds__(BLOCK, (slab_min_blocks<T, Op, WHOLE>()))
    reduce_scale_slab_reread_kernel(ArgsFor<T, Op> a, SlabSplitting s) {
  static_assert(kSlabOp<Op>, "an op the slab kernels serve");
  using A = acc_t<T>;
  using Stat = RowStat<Op, A>;
  __shared__ SlabShared<A, Stat, BLOCK, M> sm;
  const int stride = slab_stride<BLOCK, WHOLE>(s);
  for (int64_t o = blockIdx.x; o < a.view.outer; o += gridDim.x) {
    RowAccumulator<Op, A> acc[M];
    if (static_cast<int>(threadIdx.x) < stride)
      slab_add<T, Op, W, M>(a, s, a.x + o * a.view.x_so, 0, int64_t(stride) * slab_unroll(W), threadIdx.x, stride,
                            acc);
    Stat st[M];
#pragma unroll
    for (int m = 0; m < M; ++m) st[m] = acc[m].stat();
    slab_join<Op, BLOCK, M>(st, s.cvs, stride, sm.entries, sm.spare,
                            [&](int c, Stat r) { slab_column_scale<T, Op>(a, c, r, sm.scale, sm.shift); });
    __syncthreads();
    slab_block_scale<T, Op, BLOCK, W, M, WHOLE>(a, s, o, 0, s.nvec, sm.scale, sm.shift);
    __syncthreads();  // every factor read before the next slab's
  }
}

template <typename T, typename Op, int BLOCK, int W, int M, bool WHOLE>
__global__ void __launch_bounds__(BLOCK, (slab_min_blocks<T, Op, WHOLE>()))
    reduce_scale_slab_sum_kernel(ArgsFor<T, Op> a, SlabSplitting s, RowStat<Op, acc_t<T>>* stats) {
  static_assert(kSlabOp<Op>, "an op the slab kernels serve");
  using A = acc_t<T>;
  using Stat = RowStat<Op, A>;
  __shared__ SlabShared<A, Stat, BLOCK, M> sm;
  const int stride = slab_stride<BLOCK, WHOLE>(s);
  const int64_t columns = a.view.inner, tile = int64_t(stride) * slab_unroll(W);
  for (int64_t u = blockIdx.x; u < a.view.outer * s.parts; u += gridDim.x) {
    const T* xs = a.x + u / s.parts * a.view.x_so;
    RowAccumulator<Op, A> acc[M];
    if (static_cast<int>(threadIdx.x) < stride)  // tiles part, part + parts, ...
      slab_add<T, Op, W, M>(a, s, xs, u % s.parts * tile, s.parts * tile, threadIdx.x, stride, acc);
    Stat st[M];
#pragma unroll
    for (int m = 0; m < M; ++m) st[m] = acc[m].stat();
    slab_join<Op, BLOCK, M>(st, s.cvs, stride, sm.entries, sm.spare, [&](int c, Stat r) { stats[u * columns + c] = r; });
    __syncthreads();  // the entries read before the next unit's
  }
}

// Merges each (slab, column)'s parts, one block each, in one order: merged[slab * inner +
// column]. Merged in each scaling block instead, (2, 2**20, 100) read 19800 statistics a block,
// a thread's 99 in turn: 1.42 ms against torch.compile's 0.96.
template <typename T, typename Op, int BLOCK>
__global__ void __launch_bounds__(BLOCK) reduce_scale_slab_merge_kernel(ArgsFor<T, Op> a, SlabSplitting s,
                                                                        const RowStat<Op, acc_t<T>>* stats,
                                                                        RowStat<Op, acc_t<T>>* merged) {
  using Stat = RowStat<Op, acc_t<T>>;
  __shared__ Stat warp_stat[2][BLOCK / 32];
  const WarpPlace me = WarpPlace::of_thread();
  const int64_t columns = a.view.inner;
  int parity = 0;
  for (int64_t u = blockIdx.x; u < a.view.outer * columns; u += gridDim.x, parity ^= 1) {
    const int64_t o = u / columns, c = u % columns;
    Stat r = RowStatOp<Op>::template identity<Stat>();
    for (int64_t k = threadIdx.x; k < s.parts; k += BLOCK) r = RowStatOp<Op>::apply(r, stats[(o * s.parts + k) * columns + c]);
    r = block_group_reduce<RowStatOp<Op>, BLOCK / 32>(r, warp_stat[parity], 0, me);
    if (threadIdx.x == 0) merged[u] = r;
  }
}

template <typename T, typename Op, int BLOCK, int W, int M, bool WHOLE>
__global__ void __launch_bounds__(BLOCK, (slab_min_blocks<T, Op, WHOLE>()))
    reduce_scale_slab_scale_kernel(ArgsFor<T, Op> a, SlabSplitting s, const RowStat<Op, acc_t<T>>* merged) {
  static_assert(kSlabOp<Op>, "an op the slab kernels serve");
  using A = acc_t<T>;
  __shared__ A scale[kSlabMaxColumns], shift[kSlabMaxColumns];
  const int columns = static_cast<int>(a.view.inner), t = threadIdx.x;
  const int64_t units = a.view.outer * s.spans;
  for (int64_t i = blockIdx.x; i < units; i += gridDim.x) {
    const int64_t u = units - 1 - i, o = u / s.spans, span = u % s.spans;
    for (int c = t; c < columns; c += BLOCK) slab_column_scale<T, Op>(a, c, merged[o * columns + c], scale, shift);
    __syncthreads();
    slab_block_scale<T, Op, BLOCK, W, M, WHOLE>(a, s, o, span * s.span, min64((span + 1) * s.span, s.nvec), scale,
                                                shift);
    __syncthreads();  // every factor read before the next unit's
  }
}

}  // namespace normscan
