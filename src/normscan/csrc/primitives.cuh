// Shared device primitives: element conversion, 16-byte vectors with alignment
// peeling, warp/block reductions and scans, and a small host-side device cache.
// No torch includes: this header compiles with plain nvcc.
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

namespace normscan {

// ---------------------------------------------------------------- element types
// Accumulate 16- and 32-bit floats in fp32, doubles in fp64.
template <typename T> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };
template <typename T> using acc_t = typename AccType<T>::type;

// Element <-> accumulator conversion. 16-bit types specialise this in half_types.cuh,
// so this header stays free of fp16 headers.
template <typename T> struct Convert {
  static __device__ __forceinline__ acc_t<T> to_acc(T v) { return static_cast<acc_t<T>>(v); }
  static __device__ __forceinline__ T from_acc(acc_t<T> v) { return static_cast<T>(v); }
  // Two values rounded into out[0], out[1] (16-bit types round both in one instruction).
  static __device__ __forceinline__ void from_acc2(acc_t<T> lo, acc_t<T> hi, T* out) {
    out[0] = from_acc(lo);
    out[1] = from_acc(hi);
  }
};

// ---------------------------------------------------------------- 16-byte vectors
// Elements per 16-byte vector.
template <typename T> __host__ __device__ constexpr int vec16() { return static_cast<int>(16 / sizeof(T)); }

template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// N accumulator values rounded to a vector of T, in pairs.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> from_acc_vec(const acc_t<T> (&v)[N]) {
  static_assert(N % 2 == 0, "whole pairs: 16-byte vectors hold 2, 4 or 8 elements");
  Vec<T, N> out;
#pragma unroll
  for (int i = 0; i < N; i += 2) Convert<T>::from_acc2(v[i], v[i + 1], &out.v[i]);
  return out;
}

// 16-byte loads and stores; L2_LAST puts them under an L2 evict_last policy (sm_80+), so
// that L2 keeps their lines ahead of lines accessed without one.
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
template <typename T, int N, bool L2_LAST = false>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  if constexpr (L2_LAST) {
    static_assert(sizeof(T) * N == 16, "16-byte vectors");
    uint4 r;
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "l"(l2_evict_last_policy()));
    return *reinterpret_cast<const Vec<T, N>*>(&r);
  } else {
    return *reinterpret_cast<const Vec<T, N>*>(p);
  }
}
template <typename T, int N, bool L2_LAST = false>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  if constexpr (L2_LAST) {
    static_assert(sizeof(T) * N == 16, "16-byte vectors");
    const uint4 r = *reinterpret_cast<const uint4*>(&v);
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(r.x), "r"(r.y),
                 "r"(r.z), "r"(r.w), "l"(l2_evict_last_policy())
                 : "memory");
  } else {
    *reinterpret_cast<Vec<T, N>*>(p) = v;
  }
}

// A row of n elements split into an unaligned head, whole N-element vectors, and a tail.
// With N == 1 everything is "body" and head == tail == 0.
struct RowSplit {
  int64_t head;  // elements before the first aligned vector
  int64_t nvec;  // whole vectors
  int64_t tail;  // elements after the last vector
};

template <typename T, int N>
__device__ __forceinline__ RowSplit split_row(const T* p, int64_t n) {
  RowSplit s;
  if (N == 1) {
    s.head = 0;
    s.nvec = n;
    s.tail = 0;
    return s;
  }
  const auto addr = reinterpret_cast<uintptr_t>(p);
  int64_t head = static_cast<int64_t>(((sizeof(T) * N) - (addr % (sizeof(T) * N))) % (sizeof(T) * N) / sizeof(T));
  if (head > n) head = n;
  s.head = head;
  s.nvec = (n - head) / N;
  s.tail = n - head - s.nvec * N;
  return s;
}

// ---------------------------------------------------------------- asynchronous copies
// 16-byte global -> shared copies (sm_80+) that land while the thread does other work. A
// thread waits only for its own copies, so data a thread copies and later reads itself
// needs no barrier.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
// Commits this thread's copies issued so far and waits for all of them.
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
}

// ---------------------------------------------------------------- arrive/wait barriers
// A shared-memory barrier (mbarrier, sm_80+) that a subset of the block's threads arrive on
// and any thread may wait for, while the rest of the block goes on: a phase completes when
// `count` arrivals are in. Arriving releases this thread's earlier shared-memory writes to
// whoever waits for the phase.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, unsigned count) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(s), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.shared.b64 state, [%0];\n\t}" ::"r"(s) : "memory");
}
// Waits until the phase of the given parity (0 for the first, then 1, 0, ...) completes.
// sm_90's try_wait lets the thread sleep a while inside each probe (measured 1% faster on
// the look-back scan than spinning on test_wait).
#if __CUDA_ARCH__ >= 900
#define NORMSCAN_MBARRIER_PROBE "mbarrier.try_wait.parity.shared.b64"
#else
#define NORMSCAN_MBARRIER_PROBE "mbarrier.test_wait.parity.shared.b64"
#endif
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, unsigned parity) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "WAIT:\n\t" NORMSCAN_MBARRIER_PROBE " done, [%0], %1;\n\t"
      "@!done bra WAIT;\n\t}" ::"r"(s),
      "r"(parity)
      : "memory");
}
#undef NORMSCAN_MBARRIER_PROBE

// ---------------------------------------------------------------- associative ops
struct SumOp {
  template <typename A> static __device__ __forceinline__ A identity() { return A(0); }
  template <typename A> static __device__ __forceinline__ A apply(A a, A b) { return a + b; }
};
struct ProdOp {
  template <typename A> static __device__ __forceinline__ A identity() { return A(1); }
  template <typename A> static __device__ __forceinline__ A apply(A a, A b) { return a * b; }
};

constexpr unsigned kFullMask = 0xffffffffu;

// Sum over the 32 lanes of a warp; every lane gets the result.
template <typename Op, typename A>
__device__ __forceinline__ A warp_reduce(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Inclusive scan over the lanes of a warp, in lane order.
template <typename Op, typename A>
__device__ __forceinline__ A warp_inclusive_scan(A v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const A n = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v = Op::apply(n, v);
  }
  return v;
}

// Exclusive scan over the warps of a block of WARPS warps. `totals` is shared scratch of
// WARPS entries. Returns this warp's exclusive prefix; *block_total gets the total.
// Contains one __syncthreads(); callers separate reuse of `totals` by another barrier.
template <typename Op, int WARPS, typename A>
__device__ __forceinline__ A block_exclusive_scan_warps(A warp_total, A* totals, A* block_total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) totals[warp] = warp_total;
  __syncthreads();
  A t = lane < WARPS ? totals[lane] : Op::template identity<A>();
  t = warp_inclusive_scan<Op>(t, lane);
  *block_total = __shfl_sync(kFullMask, t, WARPS - 1);
  const A before = __shfl_sync(kFullMask, t, (warp + 31) % 32);
  return warp == 0 ? Op::template identity<A>() : before;
}

// ---------------------------------------------------------------- host side
// Per-device facts the launchers need, read once per device.
struct DeviceInfo {
  int sms = 0;
  int major = 0;
};

inline cudaError_t device_info(DeviceInfo* out) {
  constexpr int kMaxDevices = 64;
  static DeviceInfo cache[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= kMaxDevices) return cudaErrorInvalidDevice;
  DeviceInfo& d = cache[dev];
  if (d.sms == 0) {
    err = cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
  }
  *out = d;
  return cudaSuccess;
}

// Blocks of `kernel` that fit on the whole device at once: the size of a persistent grid.
template <typename Kernel>
inline cudaError_t resident_blocks(Kernel kernel, int threads, size_t smem, int64_t* out) {
  DeviceInfo d;
  cudaError_t err = device_info(&d);
  if (err != cudaSuccess) return err;
  int per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  if (err != cudaSuccess) return err;
  *out = static_cast<int64_t>(per_sm > 0 ? per_sm : 1) * d.sms;
  return cudaSuccess;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows (element stride x_so, y_so) may use 16-byte vectors only if every x row and its y
// row share their alignment: the same head is then peeled from both.
template <typename T>
inline bool rows_share_alignment(const T* x, const T* y, int64_t x_so, int64_t y_so, int64_t outer) {
  const auto dx = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(x) - reinterpret_cast<uintptr_t>(y));
  const auto ds = static_cast<uint64_t>((x_so - y_so) * static_cast<int64_t>(sizeof(T)));
  return dx % 16 == 0 && (outer == 1 || ds % 16 == 0);
}
// Whether every (outer, l) line of x and y along inner starts 16-byte aligned and holds
// whole vectors of n elements, contiguous (Args: either family's argument struct).
template <typename Args>
inline bool inner_vectorizable(const Args& a, int n) {
  const auto aligned = [n](int64_t stride, int64_t extent) { return extent == 1 || stride % n == 0; };
  return a.x_si == 1 && a.y_si == 1 && a.inner % n == 0 && aligned(a.x_so, a.outer) && aligned(a.y_so, a.outer) &&
         aligned(a.x_sl, a.length) && aligned(a.y_sl, a.length) && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(a.y) % 16 == 0;
}
__host__ __device__ inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

}  // namespace normscan
