// The per-lane state fragment of the sm_90a persistent decode kernel and the warp reductions
// over K that it needs (decode.cu's header comment says why this split), and the 16-byte
// vectors of the pool's dtype every decode kernel loads and stores (and the k-first row blocks'
// split fp32 state, half in shared memory). Device code, included by decode.cu, direct_warp.cu
// and kfirst_rows.cu.
#pragma once

#include <cstdint>

#include "flash_kda/forward.h"
#include "sm90/common/bf16.cuh"
#include "sm90/decode/plan.h"

namespace flash_kda::sm90::decode_detail {

constexpr int kD = kDecodeHeadDim;

constexpr int log2_int(int x) { return x <= 1 ? 0 : 1 + log2_int(x / 2); }
constexpr int kWarpCols = kDecodeWarpCols;

/// A 16-byte vector of pool elements (4 fp32 or 8 bf16) as fp32 values: the math is fp32
/// whatever the pool's dtype.
template <typename PoolT>
__device__ __forceinline__ void unpack_vec(const uint4& r, float (&v)[16 / sizeof(PoolT)]) {
  if constexpr (sizeof(PoolT) == 4) {
    v[0] = __uint_as_float(r.x), v[1] = __uint_as_float(r.y);
    v[2] = __uint_as_float(r.z), v[3] = __uint_as_float(r.w);
  } else {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = unpack_bf16(w[i]);
      v[2 * i] = t.x, v[2 * i + 1] = t.y;
    }
  }
}

/// fp32 values as a 16-byte vector of pool elements (bf16: rounded to nearest even).
template <typename PoolT>
__device__ __forceinline__ uint4 pack_vec(const float (&v)[16 / sizeof(PoolT)]) {
  if constexpr (sizeof(PoolT) == 4)
    return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
  else
    return make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
}

/// A lane's NR state vectors in fp32 for the k-first row blocks' split form (kfirst_rows.cu):
/// vectors 0 .. NF - 1 in the caller's registers (f), NF .. NR - 1 in the lane's own 16-byte
/// words of the block's dynamic shared memory, word j of vector c at ((c - NF) * E / 4 + j) *
/// stride from the lane's first (stride: the block's threads), so that the
/// 32 words of one warp access are contiguous (no bank conflict) and no lane reads a word
/// another wrote (no barrier). With NF = NR every vector is in registers and no word is used.
template <typename PoolT, int NR, int NF>
struct SplitState {
  static constexpr int E = 16 / int(sizeof(PoolT));
  using Regs = float[NF > 0 ? NF : 1][E];
  float4* lane0;  // the lane's first word
  int stride;     // words between a lane's consecutive words
  __device__ float4& word(int c, int j) const { return lane0[((c - NF) * (E / 4) + j) * stride]; }
  /// Vector c (>= NF) from the lane's words.
  __device__ void load(int c, float (&x)[E]) const {
#pragma unroll
    for (int j = 0; j < E / 4; ++j) {
      const float4 w = word(c, j);
      x[4 * j] = w.x, x[4 * j + 1] = w.y, x[4 * j + 2] = w.z, x[4 * j + 3] = w.w;
    }
  }
  /// Vector c (>= NF) to the lane's words.
  __device__ void store(int c, const float (&x)[E]) const {
#pragma unroll
    for (int j = 0; j < E / 4; ++j) word(c, j) = make_float4(x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3]);
  }
  /// The loaded pool vectors `raw` in fp32, each where it is kept: the registers' first.
  __device__ void unpack(const uint4 (&raw)[NR], Regs& f) const {
#pragma unroll
    for (int c = 0; c < NF; ++c) unpack_vec<PoolT>(raw[c], f[c]);
#pragma unroll
    for (int c = NF; c < NR; ++c) {
      float x[E];
      unpack_vec<PoolT>(raw[c], x);
      store(c, x);
    }
  }
  /// Vector c of the state as a pool vector (bf16: rounded).
  __device__ uint4 pack(int c, const Regs& f) const {
    if (c < NF) return pack_vec<PoolT>(f[c < NF ? c : 0]);
    float x[E];
    load(c, x);
    return pack_vec<PoolT>(x);
  }
};

/// The lane's piece of its warp's 128 x 8 state slice (the layouts: decode.cu's header comment).
template <StateLayout L, typename PoolT>
struct Frag {
  static constexpr bool kVFirst = L == StateLayout::VFirst;
  static constexpr int E = 16 / int(sizeof(PoolT));  // elements per 16-byte vector
  static constexpr int NC = 32 / E;                   // vectors per lane
  static constexpr int NJ = kVFirst ? 1 : E;          // value columns per lane
  /// Lane bits in which the lanes sharing a column differ: v-first 1 and 2; k-first 16, 8, ...
  /// (4 bits for fp32, 5 for bf16).
  static constexpr int kLaneBits = kVFirst ? 2 : (sizeof(PoolT) == 4 ? 4 : 5);

  /// Element offset of vector c within the head's state ([V, K] or [K, V]); col0 = the warp's
  /// first value column.
  __device__ static int offset(int c, int lane, int col0) {
    if constexpr (kVFirst) return (col0 + lane / 4) * kD + (c * 4 + lane % 4) * E;
    else if constexpr (E == 4) return ((lane >> 1) + 16 * c) * kD + col0 + (lane & 1) * 4;
    else return (lane + 32 * c) * kD + col0;
  }
  /// Key row of vector c (k-first: one row per vector); v-first: the first of its E keys.
  __device__ static int key(int c, int lane) {
    if constexpr (kVFirst) return (c * 4 + lane % 4) * E;
    else if constexpr (E == 4) return (lane >> 1) + 16 * c;
    else return lane + 32 * c;
  }
  /// Warp-local value column of the lane's column e.
  __device__ static int col(int e, int lane) {
    if constexpr (kVFirst) return lane / 4;
    else if constexpr (E == 4) return (lane & 1) * 4 + e;
    else return e;
  }
};

/// N (a multiple of 4) consecutive floats of 16-byte aligned shared memory, as float4 loads.
template <int N>
__device__ __forceinline__ void load_row(float (&dst)[N], const float* src) {
#pragma unroll
  for (int x = 0; x < N / 4; ++x) {
    const float4 t = reinterpret_cast<const float4*>(src)[x];
    dst[4 * x] = t.x, dst[4 * x + 1] = t.y, dst[4 * x + 2] = t.z, dst[4 * x + 3] = t.w;
  }
}

/// Sum of v[0..NV) over the 2^Bits lanes that differ in lane bits Top, Top / 2, ... (Bits of
/// them): a reduce-scatter (each halving level keeps half the values, the upper half where the
/// lane's bit is set, and adds the partner's copy), then a plain all-reduce of the last value.
/// After it v[0] is the sum of value number scatter_index(lane) (Top = 16; fewer levels than
/// log2(NV) leave NV / 2^Bits sums in v[0..)).
template <int NV, int Bits, int Top = 16>
__device__ __forceinline__ void reduce_scatter(float (&v)[NV], int lane) {
  int n = NV;
#pragma unroll
  for (int level = 0; level < Bits; ++level) {
    const int off = Top >> level;
    if (n > 1) {
      const bool upper = lane & off;
      const int half = n / 2;
#pragma unroll
      for (int x = 0; x < NV / 2; ++x) {
        if (x < half) {
          const float send = upper ? v[x] : v[x + half];
          const float keep = upper ? v[x + half] : v[x];
          v[x] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
      }
      n = half;
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
    }
  }
}

/// Which value reduce_scatter<NV, Bits> leaves in `lane`.
template <int NV>
__device__ __forceinline__ int scatter_index(int lane) {
  int idx = 0, n = NV;
#pragma unroll
  for (int level = 0; n > 1; ++level, n /= 2)
    if (lane & (16 >> level)) idx += n / 2;
  return idx;
}

/// Undoes reduce_scatter's halving: afterwards every lane holds all NV sums in order.
template <int NV>
__device__ __forceinline__ void all_gather(float (&v)[NV], int lane) {
  int levels = 0;
  for (int n = NV; n > 1; n /= 2) ++levels;
#pragma unroll
  for (int level = 4; level >= 0; --level) {
    if (level >= levels) continue;
    const int off = 16 >> level;
    const int n = NV >> (level + 1);  // values held before this level is undone
    const bool upper = lane & off;
#pragma unroll
    for (int x = 0; x < NV / 2; ++x) {
      if (x < n) {
        const float r = __shfl_xor_sync(0xffffffffu, v[x], off);
        const float mine = v[x];
        v[x] = upper ? r : mine;
        v[x + n] = upper ? mine : r;
      }
    }
  }
}

}  // namespace flash_kda::sm90::decode_detail
