// fp16 and bf16 elements: conversions to and from the fp32 accumulator.
// Kept apart from device/types.cuh so that float-only builds need no fp16 headers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "types.cuh"

namespace normscan {

// The widening conversions are volatile asm so that the compiler re-derives them from the
// packed 16-bit registers where they are needed, instead of keeping a second, fp32 copy of
// every register-held element (which spills the row kernels).
template <> struct Convert<__half> {
  static __device__ __forceinline__ float to_acc(__half v) {
    float r;
    asm volatile("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(__half_as_ushort(v)));
    return r;
  }
  static __device__ __forceinline__ __half from_acc(float v) { return __float2half_rn(v); }
  static __device__ __forceinline__ void from_acc2(float lo, float hi, __half* out) {
    *reinterpret_cast<__half2*>(out) = __floats2half2_rn(lo, hi);
  }
};
template <> struct Convert<__nv_bfloat16> {
  static __device__ __forceinline__ float to_acc(__nv_bfloat16 v) {
    unsigned r;
    asm volatile("mov.b32 %0, {%1, %2};" : "=r"(r) : "h"((unsigned short)0), "h"(__bfloat16_as_ushort(v)));
    return __uint_as_float(r);
  }
  static __device__ __forceinline__ __nv_bfloat16 from_acc(float v) { return __float2bfloat16_rn(v); }
  static __device__ __forceinline__ void from_acc2(float lo, float hi, __nv_bfloat16* out) {
    *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(lo, hi);
  }
};

// max.NaN on pairs: one instruction for two elements and no widening (a maximum is exact in
// the element type); sm_80 and later.
template <> struct Pairs<__half> {
  static __device__ __forceinline__ uint32_t max(uint32_t a, uint32_t b) {
    uint32_t m;
    asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(m) : "r"(a), "r"(b));
    return m;
  }
  static __device__ __forceinline__ float low(uint32_t p) { return __half2float(__ushort_as_half(p & 0xffffu)); }
  static __device__ __forceinline__ float high(uint32_t p) { return __half2float(__ushort_as_half(p >> 16)); }
};
template <> struct Pairs<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t max(uint32_t a, uint32_t b) {
    uint32_t m;
    asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(a), "r"(b));
    return m;
  }
  static __device__ __forceinline__ float low(uint32_t p) { return __uint_as_float(p << 16); }
  static __device__ __forceinline__ float high(uint32_t p) { return __uint_as_float(p & 0xffff0000u); }
};

}  // namespace normscan
