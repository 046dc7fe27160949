// Slab scans (inner a power of two up to kMaxColumns, each outer's (length, inner) block
// contiguous): a scan over time of a (batch, time, features) tensor with few features. Each
// such slab is one flat row whose element e is column e % inner's, cut into tiles spread
// over the whole GPU and chained, column by column, by a single-pass decoupled look-back,
// as the look-back row scan chains a row's tiles (lookback.cuh, whose block layout this
// follows: warp 0 looks back for the older of a block's two tiles while the data warps take
// in the newer).
//
// A tile is copied flat, whole 16-byte vectors and whole lines, into shared memory, or,
// where x's slab is not contiguous (x[..., :k] of a wider tensor, every other column, an
// unaligned start) but y's is, gathered into it a position's columns or an element at a
// time; inner columns not a power of two are padded to one, each element loaded and
// stored where it lies, or, where x's and y's slabs are contiguous, copied and stored as
// they lie and read through the padded layout (SlabCopy). There
// each data thread takes a run of NV consecutive positions of one column vector, lane =
// run * CV + cv with CV the vectors a position spans (1 where a vector holds V / inner
// positions): a warp's runs are joined by shuffles over lanes CV apart, its warps through
// shared memory. The scanned tile is written back in place and stored flat. Element i of a
// vector is the thread's column slot i % M, M = min(inner, V): column cv * M + i % M, of
// position i / M past the vector's first.
// A reverse scan reads the slab backwards, vectors flipped: its columns are then met in
// reverse order, each still a scan of its own.
#pragma once

#include "../device/async.cuh"
#include "../device/lookback.cuh"
#include "rows.cuh"

namespace normscan {

// A slab scan's shape: BLOCK threads (warp 0 looks back, the rest hold tiles), runs of NV
// positions (odd: a warp's reads of its runs from shared memory fall in distinct banks),
// MINB resident blocks a SM asked of the compiler, look-back entries of a tile ENTRY-aligned
// apart, up to MAXC columns. tuning.cuh names the one used.
template <int BLOCK, int NV, int MINB, int64_t ENTRY, int MAXC> struct ScanSlabConfig {
  static_assert(NV % 2 == 1, "runs of an odd number of vectors");
  static constexpr int kBlock = BLOCK, kVecs = NV, kMaxColumns = MAXC;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // sm_80's 164 KB of shared memory holds at most 3 of these blocks: asking for more there
  // only takes registers (16-bit slabs spilled 8 bytes at 4).
  static constexpr int kMinBlocks = MINB < 3 ? MINB : 3;
#else
  static constexpr int kMinBlocks = MINB;
#endif
  static constexpr int64_t kTileVecs = int64_t(BLOCK - 32) * NV;  // vectors of a tile
  static constexpr size_t kSmemBytes = size_t(2) * kTileVecs * 16;  // two tiles
  template <typename A> using State = ColumnLookbackState<A, ENTRY>;
  // Column slots of a vector (M above) for `columns` columns of V-element vectors.
  static __host__ __device__ constexpr int64_t slots(int64_t columns, int v) { return columns < v ? columns : v; }
};

// How a slab scan's tiles reach shared memory: x's slab copied flat, in 16-byte vectors; or
// gathered a position's columns at a time (contiguous in x and aligned to their bytes), or an
// element at a time; or, Padded, the columns padded to a power of two (the padding, and the
// positions past the last in its last vector, hold the identity and are never stored), x
// loaded and y stored an element at a time at their strides; or, Packed (unmasked, x's and
// y's slabs contiguous and alike in their 16-byte alignment), the columns padded in the
// layout only: the tile's elements copied as they lie in 16-byte vectors (the partly
// covered first and last an element at a time), each padded vector read from and written
// back to them, and stored as they lie.
enum class SlabCopy { Flat, Positions, Elements, Padded, Packed };

// Whether a slab scan's x reaches shared memory by cp.async, in flight until take_in: flat
// and packed copies, and gathered ones of 4 bytes or more (what cp.async takes: a position's
// M columns, else an element) of unmasked ops; the others load through registers.
template <typename T, typename Op, int M, SlabCopy COPY> __host__ __device__ constexpr bool slab_copied() {
  return COPY == SlabCopy::Flat || COPY == SlabCopy::Packed ||
         ((COPY == SlabCopy::Positions ? M : 1) * sizeof(T) >= 4 && !kMasked<Op>);
}

template <typename T, typename Op, int M, SlabCopy COPY, typename Cfg>
__global__ void __launch_bounds__(Cfg::kBlock, (scan_min_blocks<T, Op>(Cfg::kMinBlocks)))
    scan_slab_kernel(ScanArgsFor<T, Op> a, typename Cfg::template State<scan_acc_t<T>> st, int64_t tiles_per_slab) {
  constexpr int V = vec16<T>(), NV = Cfg::kVecs;
  constexpr int MAXC = 32 * M < Cfg::kMaxColumns ? 32 * M : Cfg::kMaxColumns;  // CV <= 32
  using A = scan_acc_t<T>;
  using VT = Vec<T, V>;
  constexpr int DATA = Cfg::kBlock - 32, DATA_WARPS = DATA / 32;
  constexpr int64_t VECS = Cfg::kTileVecs;
  // By buffer: each data warp's column totals, the tile's, and what comes before the tile.
  __shared__ A s_wtot[2][DATA_WARPS][MAXC];
  __shared__ A s_agg[2][MAXC], s_prefix[2][MAXC];
  __shared__ int64_t s_ticket[2];
  // Data-thread barriers, a phase a tile: every copy has landed; every warp total is in;
  // every run is scanned into its slots.
  __shared__ uint64_t s_landed, s_joined, s_scanned;
  extern __shared__ uint4 slots[];  // buffer b's vector j of its tile at [b * VECS + j]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = threadIdx.x - 32;
  constexpr bool PADDED = COPY == SlabCopy::Padded, PACKED = COPY == SlabCopy::Packed;
  static_assert(!PACKED || !kMasked<Op>, "packed slabs are unmasked");
  const int inner = static_cast<int>(a.view.inner);
  // The tile layout's columns (inner's, padded to a power of two).
  const int64_t layout_columns = PADDED || PACKED ? int64_t(1) << (32 - __clz(inner - 1)) : a.view.inner;
  const int columns = static_cast<int>(layout_columns);
  const int cvs = columns / M, cv = lane % cvs;
  const int run = (warp - 1) * (32 / cvs) + lane / cvs;  // data warps'
  const int64_t tiles = a.view.outer * tiles_per_slab;
  using Row = ScanRow<T, V, mask_t<Op>>;
  constexpr bool GATHER = COPY != SlabCopy::Flat;
  constexpr int G = COPY == SlabCopy::Positions ? M : 1;  // elements a gathering copy takes
  // Tickets go round the slabs: ticket t is tile t / outer of slab t % outer, so that the
  // tiles in flight spread over every slab's chain rather than queue on one (look-back
  // entries are by ticket).
  auto slab_index = [&](int64_t t) { return t % a.view.outer; };
  auto in_slab = [&](int64_t t) { return t / a.view.outer; };
  auto ticket_of = [&](int64_t t, int64_t j) { return j * a.view.outer + slab_index(t); };  // t's slab's tile j
  auto slab_of = [&](int64_t tile) {
    Row r = Row::of(a, slab_index(tile), a.view.length * layout_columns);
    if constexpr (GATHER) r.s = RowSplit{0, ceil_div(r.n, V), 0};  // y's vectors (x's address tells nothing)
    return r;
  };
  // GATHER: vector j's element i, as an offset from its slab's start in x (and the mask), or
  // with y's strides in y; and whether it is padding.
  const int shift = __ffs(columns) - 1;
  auto position_of = [&](const Row& r, int64_t j, int i) { return (r.vec_start(j) >> shift) + i / M; };
  auto column_of = [&](const Row& r, int64_t j, int i) { return static_cast<int>(r.vec_start(j) & (columns - 1)) + i % M; };
  auto element_at = [&](const Row& r, int64_t j, int i, int64_t sl, int64_t si) {
    return position_of(r, j, i) * sl + column_of(r, j, i) * si;
  };
  auto padding = [&](const Row& r, int64_t j, int i) {
    return PADDED && (column_of(r, j, i) >= inner || position_of(r, j, i) >= a.view.length);
  };
  auto slot = [&](int b, int64_t j) { return reinterpret_cast<VT*>(&slots[b * VECS + j]); };
  // PACKED: a tile of n padded vectors from `first` in scan order holds `positions` positions
  // from p0; its elements, from x's slab's element p0 * inner on, lie in buffer b from element
  // `head` on, as they lie in x: the buffer starts at the 16-byte vector that holds the first.
  // (y's slab lies as x's in its 16 bytes: the dispatcher's condition.)
  struct PackedTile {
    const T* x;  // the buffer's first element in x, and in y
    T* y;
    int head, end, positions, vecs;  // the tile's first element and its end in the buffer
  };
  auto packed_tile = [&](const Row& r, int64_t first, int n) {
    if constexpr (PACKED) {
      const int64_t v0 = r.reverse ? r.s.nvec - first - n : first;  // in x's order
      const int64_t p0 = (v0 * V) >> shift;
      const int positions = static_cast<int>(min64(a.view.length, ((v0 + n) * V) >> shift) - p0);
      const int head = static_cast<int>(reinterpret_cast<uintptr_t>(r.x + p0 * inner) % 16 / sizeof(T));
      return PackedTile{r.x + p0 * inner - head, r.y + p0 * inner - head, head, head + positions * inner, positions, n};
    } else {
      return PackedTile{};
    }
  };
  // Where element i (in x's order) of the tile's padded vector j (in scan order) lies in the
  // buffer, -1 for padding: the vector's first position and column, then i's place among its
  // V / M positions of M columns (constants, i being one).
  auto packed_at = [&](const PackedTile& pt, auto reverse, int j, int i) {
    const int e = (decltype(reverse)::value ? pt.vecs - 1 - j : j) * V;
    const int p0 = e >> shift, c0 = e & (columns - 1);
    const bool padding = c0 + i % M >= inner || p0 + i / M >= pt.positions;
    return padding ? -1 : pt.head + p0 * inner + c0 + (i / M) * inner + i % M;
  };
  auto element = [&](int b, int at) -> T& { return reinterpret_cast<T*>(&slots[b * VECS])[at]; };
  auto mine = [&](int k) { return (run * NV + k) * cvs + cv; };  // this thread's k-th vector of its run
  // Tile-local indices are ints: a tile has kTileVecs vectors (64-bit ones cost a third of
  // the scan loop's instructions).
  auto held = [&](auto reverse, const PackedTile& pt, int b, int j) {  // in scan order
    VT v;
    if constexpr (PACKED) {
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const int at = packed_at(pt, reverse, j, i);
        v.v[i] = at >= 0 ? element(b, at) : from_scan<T>(Op::template identity<A>());
      }
    } else {
      v = *slot(b, j);
    }
    if constexpr (decltype(reverse)::value) Row::flip(&v);
    return v;
  };
  // Data warps: start copying `tile` into buffer b, warp-striped; a masked tile's mask
  // elements load into `staged`, for two column slots after every copy is issued, for more
  // beside each copy. Masked cumsums, us, after / beside: bf16 (1024, 4096, 2) 28.1 / 33.1,
  // (1, 4194304, 2) 31.5 / 32.8, (64, 8192, 16) 39.6 / 37.5, (8, 16384, 64) 44.3 / 41.9; fp32
  // alike, and with 4 slots (fp32 with a bool mask, sm_90) the staged masks spilled after.
  // GATHER: unmasked ops copy G elements at a time where that is 4 bytes or more (what
  // cp.async takes), each copy to its place in its vector's slot, waited for as vectors are;
  // Padded ones store the identity into their padding (fp32 cumsum, us, loaded through
  // registers / copied: (1, 4194304, 3) 92.8 / 84.7, (8, 1048576, 5) 333.1 / 310.8, (2,
  // 2097152, 12) 359.6 / 347.5, (4, 1048576, 100) 3950 / 3766, H100). The others load a
  // vector's elements one by one (the padding the identity),
  // mask them and store the vector into its slot, so their wait is here, not in take_in:
  // held in registers until take_in, or a tile's (or two vectors') loads issued before any
  // store, they spilled 12-1024 bytes (sm_90); so did fp32's copies with a bool mask's
  // elements staged (12 bytes).
  constexpr bool kCopied = slab_copied<T, Op, M, COPY>();
  constexpr bool kMasksAfterCopies = M == 2;
  typename Row::Mask staged[kCopied ? NV : 1];
  auto stage = [&](int64_t tile, int b) {
    if (tile >= tiles) return;
    const Row r = slab_of(tile);
    const int64_t first = in_slab(tile) * VECS;
    const int n = static_cast<int>(min64(r.s.nvec - first, VECS));
    if constexpr (PACKED) {  // whole vectors by cp.async, the first and last an element at a time
      const PackedTile pt = packed_tile(r, first, n);
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int j = k * DATA + d, e0 = j * V;
        if (e0 >= pt.end) continue;
        if (e0 >= pt.head && e0 + V <= pt.end) {
          cp_async16(slot(b, j), pt.x + e0);
          continue;
        }
#pragma unroll
        for (int i = 0; i < V; ++i)
          if (e0 + i >= pt.head && e0 + i < pt.end) copy_element(&element(b, e0 + i), pt.x + e0 + i);
      }
    } else {
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (k * DATA + d < n) {
          const int64_t j = first + k * DATA + d;
          VT* s = slot(b, k * DATA + d);
          const auto at = [&](int i) { return element_at(r, j, i, a.view.x_sl, a.view.x_si); };
          if constexpr (!GATHER) {
            cp_async16(s, r.vec_ptr(j));
            if constexpr (kMasked<Op> && !kMasksAfterCopies) staged[k] = r.mask_of(j);
          } else if constexpr (kCopied) {
#pragma unroll
            for (int i = 0; i < V; i += G) {
              if constexpr (PADDED) {  // a constant, so that the other copies' code is as it was
                if (padding(r, j, i)) {
                  s->v[i] = from_scan<T>(Op::template identity<A>());
                  continue;
                }
              }
              cp_async_bytes<G * sizeof(T)>(&s->v[i], r.x + at(i));
            }
          } else {
            VT v;
#pragma unroll
            for (int i = 0; i < V; ++i) {
              if (padding(r, j, i)) {
                v.v[i] = from_scan<T>(Op::template identity<A>());
              } else if constexpr (kMasked<Op>) {
                v.v[i] = masked(r.x[at(i)], r.m[at(i)]);
              } else {
                v.v[i] = r.x[at(i)];
              }
            }
            *s = v;
          }
        }
      if constexpr (!GATHER && kMasked<Op> && kMasksAfterCopies) {
#pragma unroll
        for (int k = 0; k < NV; ++k)
          if (k * DATA + d < n) staged[k] = r.mask_of(first + k * DATA + d);
      }
    }
  };
  // Data warps: once buffer b has landed, each run's column totals scanned across its warp
  // (ex: the runs before it in the warp); the tile's column totals published (its inclusive
  // prefixes for a slab's first tile), and the next ticket taken into s_ticket[next].
  unsigned phase = 0;
  auto take_in = [&](int64_t tile, int b, int next, A(&ex)[M]) {
    const Row r = slab_of(tile);
    const int64_t c_idx = in_slab(tile), first = c_idx * VECS;
    const int n = static_cast<int>(min64(r.s.nvec - first, VECS));
    const PackedTile pt = packed_tile(r, first, n);
    if constexpr (kCopied) {  // else the tile is in its slots, masked
      cp_async_wait_all();  // only this tile's copies are in flight
      if constexpr (kMasked<Op>) {  // x times its mask, in place, by the thread that copied it
#pragma unroll
        for (int k = 0; k < NV; ++k)
          if (k * DATA + d < n) {
            VT* s = slot(b, k * DATA + d);
            *s = masked_vec(*s, staged[k].values());
          }
      }
    }
    mbarrier_arrive(&s_landed);
    mbarrier_wait(&s_landed, phase);
    A t[M];
#pragma unroll
    for (int m = 0; m < M; ++m) t[m] = Op::template identity<A>();
    with_flag(r.reverse, [&](auto reverse) {
#pragma unroll 1  // a vector at a time from shared memory: unrolled, 16-bit slabs spilled
      for (int k = 0; k < NV; ++k)
        if (mine(k) < n) {
          const VT v = held(reverse, pt, b, mine(k));
#pragma unroll
          for (int i = 0; i < V; ++i) t[i % M] = Op::apply(t[i % M], to_scan<T>(v.v[i]));
        }
    });
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const A inc = warp_inclusive_scan_strided<Op>(t[m], lane, cvs);
      const A up = __shfl_up_sync(kFullMask, inc, cvs);
      ex[m] = lane < cvs ? Op::template identity<A>() : up;
      if (lane >= 32 - cvs) s_wtot[b][warp - 1][cv * M + m] = inc;
    }
    mbarrier_arrive(&s_joined);
    if (d < columns) {  // column d's thread
      mbarrier_wait(&s_joined, phase);
      A total = Op::template identity<A>();
#pragma unroll
      for (int w = 0; w < DATA_WARPS; ++w) total = Op::apply(total, s_wtot[b][w][d]);
      s_agg[b][d] = total;
      publish(c_idx == 0 ? st.inclusive(tile, d) : st.aggregate(tile, d), total);
      if (d == 0) s_ticket[next] = st.take_ticket();
    }
    phase ^= 1;
  };
  // Warp 0 (and warp 1 from 64 columns on, once it has taken in its tile): each column's
  // prefix of the slab's tiles before `tile` into s_prefix[b], and the tile's inclusive
  // prefixes published. A pass takes up to 32 columns (`group`), lane p * group + c: 32 /
  // group predecessors a step, p the nearer the smaller; warp w takes passes w, w + 2, ...
  // of `passes` (all on warp 0, fp32 cumsum 4x16384x128 took 79 us, now 66; 8x16384x64 53, now 51).
  auto look_back = [&](int64_t tile, int b, int first_pass, int passes) {
    const int64_t c_idx = in_slab(tile);
    const int group = columns < 32 ? columns : 32, p = lane / group;
    const unsigned column_lanes = static_cast<unsigned>(0xffffffffull / ((1ull << group) - 1)) << (lane % group);
    for (int c0 = first_pass * group; c0 < columns; c0 += passes * group) {
      const int c = c0 + lane % group;
      A prefix = Op::template identity<A>();
      if (c_idx > 0) {
        bool found = false;  // column c met an inclusive prefix
        for (int64_t j = c_idx - 1 - p;; j -= 32 / group) {
          bool inclusive = true;
          A v = Op::template identity<A>();
          if (!found && j >= 0) {
            A agg;
            do load_published(st.inclusive(ticket_of(tile, j), c), &v, &agg);
            while (unpublished(v) && unpublished(agg));
            inclusive = !unpublished(v);
            if (!inclusive) v = agg;
          }
          // Column c's lanes from its nearest inclusive prefix on give nothing.
          const unsigned stops = __ballot_sync(kFullMask, inclusive) & column_lanes;
          A s = stops == 0 || lane <= __ffs(stops) - 1 ? v : Op::template identity<A>();
          for (int o = group; o < 32; o <<= 1) s = Op::apply(s, __shfl_xor_sync(kFullMask, s, o));
          prefix = Op::apply(s, prefix);
          found = found || stops != 0;
          if (__all_sync(kFullMask, found)) break;
        }
        if (p == 0) publish(st.inclusive(tile, c), Op::apply(prefix, s_agg[b][c]));
      }
      if (p == 0) s_prefix[b][c] = prefix;
    }
  };
  // Data warps: scan buffer b's tile into its slots from each run's start, then store it flat.
  unsigned scanned = 0;
  auto scan_out = [&](int64_t tile, int b, const A(&ex)[M]) {
    const Row r = slab_of(tile);
    const int64_t first = in_slab(tile) * VECS;
    const int n = static_cast<int>(min64(r.s.nvec - first, VECS));
    const PackedTile pt = packed_tile(r, first, n);
    A start[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int c = cv * M + m;
      A before = s_prefix[b][c];
      for (int w = 0; w < warp - 1; ++w) before = Op::apply(before, s_wtot[b][w][c]);
      start[m] = Op::apply(before, ex[m]);
    }
    with_flag(r.reverse, [&](auto reverse) {
      with_flag(a.exclusive, [&](auto exclusive) {
#pragma unroll 1
        for (int k = 0; k < NV; ++k)
          if (mine(k) < n) {
            const VT v = held(reverse, pt, b, mine(k));
            VT out;
#pragma unroll
            for (int i = 0; i < V; ++i)
              start[i % M] = scan_step<Op, T>(to_scan<T>(v.v[i]), start[i % M], decltype(exclusive)::value, true,
                                              out.v[i]);
            if constexpr (decltype(reverse)::value) Row::flip(&out);
            if constexpr (PACKED) {
#pragma unroll
              for (int i = 0; i < V; ++i) {
                const int at = packed_at(pt, reverse, mine(k), i);
                if (at >= 0) element(b, at) = out.v[i];
              }
            } else {
              *slot(b, mine(k)) = out;
            }
          }
      });
    });
    mbarrier_arrive(&s_scanned);
    mbarrier_wait(&s_scanned, scanned);
    scanned ^= 1;
    if constexpr (PACKED) {  // as stage copied them: each thread its own vectors
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int j = k * DATA + d, e0 = j * V;
        if (e0 >= pt.end) continue;
        if (e0 >= pt.head && e0 + V <= pt.end) {
          store_vec<T, V>(pt.y + e0, *slot(b, j));
          continue;
        }
#pragma unroll
        for (int i = 0; i < V; ++i)
          if (e0 + i >= pt.head && e0 + i < pt.end) pt.y[e0 + i] = element(b, e0 + i);
      }
    } else {
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (k * DATA + d < n) {
          const int64_t j = first + k * DATA + d;
          if constexpr (PADDED) {
            const VT out = *slot(b, k * DATA + d);
#pragma unroll
            for (int i = 0; i < V; ++i)
              if (!padding(r, j, i)) r.y[element_at(r, j, i, a.view.y_sl, a.view.y_si)] = out.v[i];
          } else {
            store_vec<T, V>(r.y + r.vec_start(j), *slot(b, k * DATA + d));
          }
        }
    }
  };

  if (threadIdx.x == 0) {
    mbarrier_init(&s_landed, DATA);
    mbarrier_init(&s_joined, DATA);
    mbarrier_init(&s_scanned, DATA);
  }
  if (threadIdx.x == 32) s_ticket[0] = st.take_ticket();
  __syncthreads();
  int64_t older = s_ticket[0];
  A ex_older[M], ex_newer[M];
  if (warp > 0 && older < tiles) {
    stage(older, 0);
    take_in(older, 0, 1, ex_older);
  }
  __syncthreads();
  int64_t newer = older < tiles ? s_ticket[1] : tiles;
  if (warp > 0) stage(newer, 1);
  const int passes = columns >= 64 ? 2 : 1;  // of the look-back: warp 0's, and warp 1's from 64 columns on
  for (int b = 0; older < tiles; b ^= 1) {
    if (warp == 0) {
      look_back(older, b, 0, passes);
    } else if (newer < tiles) {
      take_in(newer, b ^ 1, b, ex_newer);
    } else if (d == 0) {
      s_ticket[b] = tiles;
    }
    if (warp == 1 && passes == 2) look_back(older, b, 1, 2);
    __syncthreads();
    const int64_t next = s_ticket[b];
    if (warp > 0) {
      scan_out(older, b, ex_older);
      stage(next, b);  // each thread overwrites only the slots it has just stored
    }
#pragma unroll
    for (int m = 0; m < M; ++m) ex_older[m] = ex_newer[m];
    older = newer;
    newer = next;
  }
}

}  // namespace normscan
