// Shared-memory slots of the sm_90a persistent decode kernel and the element access helpers
// the decode kernels share (global and shared memory). Device code, included by decode.cu,
// direct_warp.cu.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cute/arch/copy_sm80.hpp>

#include "sm90/common/bf16.cuh"
#include "sm90/decode/params.h"
#include "sm90/decode/plan.h"

namespace flash_kda::sm90::decode_detail {

/// One staging slot (decode_slot_bytes(warps, tg) bytes at `base`, 16-byte aligned): the staged
/// tokens of one work item. q, k, d and v first hold the raw input rows (the inputs' dtype, as
/// cp.async lands them, each lane's 4 elements at element 4 * lane of the row) and are then
/// rewritten in place as fp32 by the warp that copied them.
struct Staging {
  float* q;       // [tg][128] scale * q (normalised)
  float* k;       // [tg][128] k (normalised)
  float* d;       // [tg][128] exp(a): the raw g row until the token is finished
  float* v;       // [tg][warps * 8] the block's value columns
  float* par;     // [warps][132] each warp's copy of dt_bias[hv] (128 floats) and A_log[hv] (at 128)
  float* b;       // [tg] beta after its activation
  int64_t* slot;  // [tg] pool slot the token's state goes to (PerToken), -1: none
  char* head;     // [warps][kDecodeItemHeadBytes] each warp's copy of the item's header
  __device__ Staging(char* base, int tg, int warps) {
    q = reinterpret_cast<float*>(base);
    k = q + tg * kDecodeHeadDim;
    d = k + tg * kDecodeHeadDim;
    v = d + tg * kDecodeHeadDim;
    par = v + tg * warps * kDecodeWarpCols;
    b = par + warps * (kDecodeHeadDim + 4);
    slot = reinterpret_cast<int64_t*>(b + ((tg + 1) & ~1));
    head = reinterpret_cast<char*>(slot + tg);
  }
};

/// Elements i .. i + 3 of a bf16 or fp32 array (global or shared) as fp32; 8- (bf16) or 16-byte
/// (fp32) aligned.
__device__ __forceinline__ float4 load4(const void* base, int64_t i, bool f32) {
  if (f32) return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
  const uint2 r = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(base) + i);
  const float2 lo = unpack_bf16(r.x), hi = unpack_bf16(r.y);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

/// Starts the copy of elements src_i .. src_i + 3 of `src` (bf16 or fp32, global) to elements
/// dst_i .. dst_i + 3 of `dst` (shared, same dtype) as one cp.async of 8 or 16 bytes.
__device__ __forceinline__ void copy4_async(void* dst, int64_t dst_i, const void* src, int64_t src_i, bool f32) {
  if (f32) {
    cute::SM80_CP_ASYNC_CACHEALWAYS<cute::uint128_t>::copy(
        *reinterpret_cast<const cute::uint128_t*>(static_cast<const float*>(src) + src_i),
        *reinterpret_cast<cute::uint128_t*>(static_cast<float*>(dst) + dst_i));
  } else {
    cute::SM80_CP_ASYNC_CACHEALWAYS<uint64_t>::copy(
        *reinterpret_cast<const uint64_t*>(static_cast<const __nv_bfloat16*>(src) + src_i),
        *reinterpret_cast<uint64_t*>(static_cast<__nv_bfloat16*>(dst) + dst_i));
  }
}

__device__ __forceinline__ int64_t load_index(const void* base, int64_t i, bool is64) {
  return is64 ? static_cast<const int64_t*>(base)[i] : int64_t(static_cast<const int32_t*>(base)[i]);
}

/// Element i of an activation (beta, or one element of v) as its raw bits (fp32, or bf16 in the
/// low half): the load is issued here, its value first needed where bits_value converts it.
__device__ __forceinline__ uint32_t load_bits(const ActView& a, int64_t i) {
  return a.f32 ? static_cast<const uint32_t*>(a.data)[i] : uint32_t(static_cast<const unsigned short*>(a.data)[i]);
}

/// The value of load_bits' raw bits.
__device__ __forceinline__ float bits_value(uint32_t bits, bool f32) {
  return f32 ? __uint_as_float(bits) : __uint_as_float(bits << 16);
}

}  // namespace flash_kda::sm90::decode_detail
