// The sm_90a decode kernel: the KDA recurrence for T = 1..16 tokens per sequence (varlen: any
// length), each (sequence, value head) state read once from its slot and written once per kept
// token. Semantics: include/flash_kda/decode.h.
//
// Why this shape. The call is bound by the state's bytes: a 128 x 128 state is 64 KB in fp32,
// 32 KB in bf16, against ~1.5 KB of q, k, g and v per token. So the kernel's job is to keep
// enough state bytes in flight on every SM and to do little else.
// - Work split: a warp owns 8 value columns of one (sequence, value head) state, all 128 key
//   rows of them (32 elements per lane, 128 bytes of fp32 state: 8 16-byte loads in flight per
//   lane, 4 KB per warp). Every reduction over K then stays inside the warp (shuffles, no
//   shared memory, no block barrier in the token loop). A block is 4 warps (32 columns: 4 blocks
//   per head) or, for small batches, 2 (16 columns: 8 blocks per head; plan.h).
// - Per-lane fragment, 16-byte vectors of the pool's dtype (E = 4 fp32 or 8 bf16 elements):
//   v-first [V, K]: lane = (column r = lane / 4, quarter s = lane % 4), vector c holds keys
//   (4c + s) E .. + E - 1 of column r; a warp instruction reads 8 rows x 64 contiguous bytes.
//   k-first [K, V]: fp32: lane = (row group lane / 2, column half lane % 2), vector c holds
//   columns 4 (lane % 2) .. + 3 of key row lane / 2 + 16 c; bf16: vector c holds the warp's 8
//   columns of key row lane + 32 c. So each lane reduces over its own keys first; the rest of
//   the reduction is 2 shuffles (v-first) or a reduce-scatter + all-gather over the lanes that
//   share columns (k-first: 8 shuffles for fp32, 16 for bf16, instead of 16 and 40 for a
//   plain all-reduce of every column).
// - Per token (fp32 math whatever the pool dtype): S <- diag(exp(a)) S; u = b (v - S^T k);
//   S += k u^T; o = S^T (scale q). The token's q, k (normalised), exp(a) (the gate's 128 exps),
//   b and the block's v columns are computed once per block into shared memory ("staging",
//   one warp per token, norms by warp shuffles), for up to 16 tokens at once (fixed length:
//   all T; varlen: rounds of 4), then one barrier; the token loop reads them as broadcasts.
// - The state loads are issued before the staging, so their latency overlaps it; the only
//   dependent chain before them is the slot index (and num_accepted_tokens) for pool calls.
// - Pool semantics: the start slot decides a skip (negative or >= P: zero rows of out, no state
//   access); with [N, T] indices each token's state goes to its own slot when that is valid.
// Bytes: the floor's exactly (one read + one write of each state, T writes with [N, T]);
// registers allow 3 blocks of 4 warps per SM for v-first (<= 148 registers), 4 for k-first
// (<= 128). Measured on the H200 this runs at 1.5-2.7x the floor at large N, slower than fla's
// Triton kernel at most points: each block loads, computes, then stores, and the resident
// blocks do not cover those gaps (docs/performance.md, "Decode", with the levers).
// Small calls (1 x 32 heads) are a single launch of ~3 dependent memory round trips (index,
// state, store).
// Modes: layout and pool dtype are template parameters (they shape the fragment), and so is
// the gate mode (3); input dtypes, the index kind and the beta / norm flags are uniform
// runtime branches (cheap: they touch only the staging). 12 kernels in all.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/gate.h"
#include "sm90/common/bf16.cuh"
#include "sm90/common/cuda_check.h"
#include "sm90/common/device_props.h"
#include "sm90/common/launch_config.h"
#include "sm90/common/ptx.cuh"
#include "sm90/decode/launch.h"
#include "sm90/decode/params.h"
#include "sm90/decode/plan.h"

namespace flash_kda::sm90 {
namespace {

constexpr int kD = kDecodeHeadDim;
constexpr int kWarpCols = kDecodeWarpCols;

/// The lane's piece of its warp's 128 x 8 state slice (see the top of the file).
template <StateLayout L, typename PoolT>
struct Frag {
  static constexpr bool kVFirst = L == StateLayout::VFirst;
  static constexpr int E = 16 / int(sizeof(PoolT));  // elements per 16-byte vector
  static constexpr int NC = 32 / E;                   // vectors per lane
  static constexpr int NJ = kVFirst ? 1 : E;          // value columns per lane
  /// Lane bits in which the lanes sharing a column differ: v-first 1 and 2; k-first 16, 8, ...
  /// (4 bits for fp32, 5 for bf16).
  /// Blocks per SM the register budget must allow (launch bounds): 4 (16 warps, 64 KB of fp32
  /// state in flight per SM); v-first's 32 distinct keys per lane need more registers, 3.
  static constexpr int kMinBlocks = kVFirst ? 3 : 4;
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

__device__ __forceinline__ float4 load4(const void* base, int64_t i, bool f32) {
  if (f32) return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
  const uint2 r = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(base) + i);
  const float2 lo = unpack_bf16(r.x), hi = unpack_bf16(r.y);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

/// N (a multiple of 4) consecutive floats of 16-byte aligned shared memory, as float4 loads.
template <int N>
__device__ __forceinline__ void load_row(float (&dst)[N], const float* src) {
#pragma unroll
  for (int x = 0; x < N / 4; ++x) {
    const float4 t = reinterpret_cast<const float4*>(src)[x];
    dst[4 * x] = t.x, dst[4 * x + 1] = t.y, dst[4 * x + 2] = t.z, dst[4 * x + 3] = t.w;
  }
}

__device__ __forceinline__ void store_f(void* base, int64_t i, float x, bool f32) {
  if (f32) static_cast<float*>(base)[i] = x;
  else static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x);
}

__device__ __forceinline__ int64_t load_index(const void* base, int64_t i, bool is64) {
  return is64 ? static_cast<const int64_t*>(base)[i] : int64_t(static_cast<const int32_t*>(base)[i]);
}

/// Sum of v[0..NV) over the 2^Bits lanes that differ in lane bits 16, 8, ... (Bits of them):
/// a reduce-scatter (each halving level keeps half the values, the upper half where the lane's
/// bit is set, and adds the partner's copy), then a plain all-reduce of the last value. After it
/// v[0] is the sum of value number scatter_index(lane).
template <int NV, int Bits>
__device__ __forceinline__ void reduce_scatter(float (&v)[NV], int lane) {
  int n = NV;
#pragma unroll
  for (int level = 0; level < Bits; ++level) {
    const int off = 16 >> level;
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

/// Shared memory of one block: `tg` staged tokens.
struct Staging {
  float* q;   // [tg][128] scale * q (normalised)
  float* k;   // [tg][128] k (normalised)
  float* d;   // [tg][128] exp(a)
  float* v;   // [tg][warps * 8] the block's value columns
  float* b;   // [tg]
  int64_t* slot;  // [tg] pool slot the token's state goes to (PerToken), -1: none
  __device__ Staging(char* smem, int tg, int warps) {
    q = reinterpret_cast<float*>(smem);
    k = q + tg * kD;
    d = k + tg * kD;
    v = d + tg * kD;
    b = v + tg * warps * kWarpCols;
    slot = reinterpret_cast<int64_t*>(b + ((tg + 1) & ~1));
  }
};

template <StateLayout L, typename PoolT, GateMode Gate>
__global__ void __launch_bounds__(128, Frag<L, PoolT>::kMinBlocks) decode_kernel(const DecodeParams p) {
  using F = Frag<L, PoolT>;
  extern __shared__ __align__(16) char smem[];
  const int warps = int(blockDim.x) / 32;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t bid = blockIdx.x;
  const int slice = int(bid % p.slices);
  const int64_t nh = bid / p.slices;
  const int hv = int(nh % p.value_heads);
  const int64_t n = nh / p.value_heads;
  const int h = hv / p.group;
  const int block_col0 = slice * warps * kWarpCols;
  const int col0 = block_col0 + warp * kWarpCols;

  const bool varlen = p.seq.cu_seqlens != nullptr;
  const int64_t tok0 = varlen ? p.seq.start(n) : 0;        // first token row of the sequence
  const int64_t len = varlen ? p.seq.length(n) : p.seq.seqlen;
  const int64_t bat = varlen ? 0 : n;                       // batch row

  // The start slot, and whether the sequence is skipped.
  int64_t slot_in = n;
  if (p.index_kind != IndexKind::None) {
    int64_t t_start = 0;
    if (p.accepted != nullptr) {
      t_start = load_index(p.accepted, n * p.acc_stride, p.accepted_64) - 1;
      t_start = t_start < 0 ? 0 : (t_start >= p.seq.seqlen ? p.seq.seqlen - 1 : t_start);
    }
    slot_in = load_index(p.indices, n * p.idx_seq_stride + t_start * p.idx_tok_stride, p.indices_64);
    if (len == 0) return;  // nothing to compute; the slot already holds the state
    if (slot_in < 0 || slot_in >= p.pool_slots) {
      // Padded: zero rows of out, no state read or written.
      for (int64_t e = lane; e < len * kWarpCols; e += 32) {
        const int64_t t = e / kWarpCols;
        const int c = int(e % kWarpCols);
        store_f(const_cast<void*>(p.out.data), bat * p.out.batch + (tok0 + t) * p.out.token + hv * p.out.head + col0 + c,
                0.f, p.out.f32);
      }
      return;
    }
  }

  // Issue the state loads first: their latency overlaps the staging below.
  constexpr int64_t kHeadElems = int64_t(kD) * kD;
  uint4 raw[F::NC];
  if (p.state_in != nullptr) {
    const PoolT* s = static_cast<const PoolT*>(p.state_in) + slot_in * p.in_slot_stride + hv * kHeadElems;
#pragma unroll
    for (int c = 0; c < F::NC; ++c) raw[c] = *reinterpret_cast<const uint4*>(s + F::offset(c, lane, col0));
  } else {
#pragma unroll
    for (int c = 0; c < F::NC; ++c) raw[c] = make_uint4(0, 0, 0, 0);
  }

  // Per-lane gate constants for channels 4 lane .. 4 lane + 3.
  const ptx::FastMath fm;
  const float a_log = p.A_log != nullptr ? p.A_log[hv] : 0.f;
  float bias[4] = {0.f, 0.f, 0.f, 0.f};
  if (Gate != GateMode::PreGated && p.dt_bias != nullptr) {
    const float4 b4 = *reinterpret_cast<const float4*>(p.dt_bias + int64_t(hv) * kD + 4 * lane);
    bias[0] = b4.x, bias[1] = b4.y, bias[2] = b4.z, bias[3] = b4.w;
  }
  math::SafeGateLog2<float> safe{};
  float neg_rate = 0.f;
  if constexpr (Gate == GateMode::SafeSigmoid) {
    safe = math::safe_gate_log2_head(a_log, p.lower_bound, fm);
    for (int c = 0; c < 4; ++c) bias[c] *= safe.rate2;  // bias2 = rate2 dt_bias
  } else if constexpr (Gate == GateMode::Softplus) {
    neg_rate = -fm.exp(a_log);
  }

  const int tg = p.token_group;
  Staging st(smem, tg, warps);
  const int vcols = warps * kWarpCols;

  if (len == 0) {  // a sequence of no tokens (varlen, no pool) passes its start state through
    if (p.state_out != nullptr) {
      PoolT* s = static_cast<PoolT*>(p.state_out) + n * p.out_slot_stride + hv * kHeadElems;
#pragma unroll
      for (int c = 0; c < F::NC; ++c) *reinterpret_cast<uint4*>(s + F::offset(c, lane, col0)) = raw[c];
    }
    return;
  }

  float f[F::NC][F::E];
  // One round: stage tokens g0 .. g0 + cnt - 1 (one warp per token), then run them.
  auto stage = [&](int64_t g0, int cnt) {
#pragma unroll 1
    for (int tt = warp; tt < cnt; tt += warps) {
      const int64_t row = tok0 + g0 + tt;
      const int64_t qk_off = bat * p.q.batch + row * p.q.token + h * p.q.head + 4 * lane;
      float4 q4 = load4(p.q.data, qk_off, p.q.f32);
      float4 k4 = load4(p.k.data, bat * p.k.batch + row * p.k.token + h * p.k.head + 4 * lane, p.k.f32);
      const float4 g4 = load4(p.g.data, bat * p.g.batch + row * p.g.token + hv * p.g.head + 4 * lane, p.g.f32);
      float qs = p.scale, ks = 1.f;
      if (p.l2norm) {
        float sq = q4.x * q4.x + q4.y * q4.y + q4.z * q4.z + q4.w * q4.w;
        float sk = k4.x * k4.x + k4.y * k4.y + k4.z * k4.z + k4.w * k4.w;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          sq += __shfl_xor_sync(0xffffffffu, sq, off);
          sk += __shfl_xor_sync(0xffffffffu, sk, off);
        }
        qs *= ptx::rsqrt(sq + float(math::kL2NormEps));
        ks = ptx::rsqrt(sk + float(math::kL2NormEps));
      }
      q4 = make_float4(q4.x * qs, q4.y * qs, q4.z * qs, q4.w * qs);
      k4 = make_float4(k4.x * ks, k4.y * ks, k4.z * ks, k4.w * ks);
      const float gin[4] = {g4.x, g4.y, g4.z, g4.w};
      float dec[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float a2;
        if constexpr (Gate == GateMode::SafeSigmoid) a2 = math::safe_gate_log2(gin[c], bias[c], safe, fm);
        else if constexpr (Gate == GateMode::Softplus) a2 = math::softplus_gate_log2(gin[c] + bias[c], neg_rate, fm);
        else a2 = gin[c] * float(math::kLog2e);
        dec[c] = ptx::ex2(a2);
      }
      *reinterpret_cast<float4*>(st.q + tt * kD + 4 * lane) = q4;
      *reinterpret_cast<float4*>(st.k + tt * kD + 4 * lane) = k4;
      *reinterpret_cast<float4*>(st.d + tt * kD + 4 * lane) = make_float4(dec[0], dec[1], dec[2], dec[3]);
      if (4 * lane < vcols)
        *reinterpret_cast<float4*>(st.v + tt * vcols + 4 * lane) =
            load4(p.v.data, bat * p.v.batch + row * p.v.token + hv * p.v.head + block_col0 + 4 * lane, p.v.f32);
      if (lane == 0) {
        const int64_t bi = bat * p.beta.batch + row * p.beta.token + hv * p.beta.head;
        const float braw = p.beta.f32 ? static_cast<const float*>(p.beta.data)[bi]
                                      : __bfloat162float(static_cast<const __nv_bfloat16*>(p.beta.data)[bi]);
        float bv = braw;
        if (p.beta_sigmoid) bv = math::beta_sigmoid_log2(braw, fm) * (p.neg_eigval ? 2.f : 1.f);
        st.b[tt] = bv;
        int64_t ws = -1;
        if (p.index_kind == IndexKind::PerToken) {
          ws = load_index(p.indices, n * p.idx_seq_stride + (g0 + tt) * p.idx_tok_stride, p.indices_64);
          if (ws >= p.pool_slots) ws = -1;
        }
        st.slot[tt] = ws;
      }
    }
  };
  auto run = [&](int64_t g0, int cnt) {
#pragma unroll 1
    for (int tt = 0; tt < cnt; ++tt) {
      const float* sq = st.q + tt * kD;
      const float* sk = st.k + tt * kD;
      const float* sd = st.d + tt * kD;
      const float* sv = st.v + tt * vcols + warp * kWarpCols;
      const float b = st.b[tt];
      float acc[F::NJ];
#pragma unroll
      for (int e = 0; e < F::NJ; ++e) acc[e] = 0.f;
      // S <- diag(exp(a)) S and the lane's part of S^T k.
#pragma unroll
      for (int c = 0; c < F::NC; ++c) {
        const int i = F::key(c, lane);
        if constexpr (F::kVFirst) {
          float dv[F::E], kv[F::E];
          load_row<F::E>(dv, sd + i);
          load_row<F::E>(kv, sk + i);
#pragma unroll
          for (int e = 0; e < F::E; ++e) {
            f[c][e] *= dv[e];
            acc[0] = fmaf(f[c][e], kv[e], acc[0]);
          }
        } else {
          const float dv = sd[i], kv = sk[i];
#pragma unroll
          for (int e = 0; e < F::E; ++e) {
            f[c][e] *= dv;
            acc[e] = fmaf(f[c][e], kv, acc[e]);
          }
        }
      }
      // Keeps the second pass's shared-memory loads below the first pass: hoisted, they would
      // hold 64 more registers and cost occupancy (the state bytes in flight).
      asm volatile("" ::: "memory");
      float u[F::NJ];
      if constexpr (F::kVFirst) {
        static_assert(F::kLaneBits == 2, "v-first: the 4 lanes of a column differ in lane bits 1 and 2");
        acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], 1);
        acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], 2);
      } else {
        reduce_scatter<F::NJ, F::kLaneBits>(acc, lane);
        all_gather<F::NJ>(acc, lane);
      }
#pragma unroll
      for (int e = 0; e < F::NJ; ++e) u[e] = b * (sv[F::col(e, lane)] - acc[e]);
      // S += k u^T and the lane's part of S^T q.
      float o[F::NJ];
#pragma unroll
      for (int e = 0; e < F::NJ; ++e) o[e] = 0.f;
#pragma unroll
      for (int c = 0; c < F::NC; ++c) {
        const int i = F::key(c, lane);
        if constexpr (F::kVFirst) {
          float kv[F::E], qv[F::E];
          load_row<F::E>(kv, sk + i);
          load_row<F::E>(qv, sq + i);
#pragma unroll
          for (int e = 0; e < F::E; ++e) {
            f[c][e] = fmaf(kv[e], u[0], f[c][e]);
            o[0] = fmaf(f[c][e], qv[e], o[0]);
          }
        } else {
          const float kv = sk[i], qv = sq[i];
#pragma unroll
          for (int e = 0; e < F::E; ++e) {
            f[c][e] = fmaf(kv, u[e], f[c][e]);
            o[e] = fmaf(f[c][e], qv, o[e]);
          }
        }
      }
      const int64_t row = tok0 + g0 + tt;
      const int64_t out_row = bat * p.out.batch + row * p.out.token + hv * p.out.head + col0;
      void* out = const_cast<void*>(p.out.data);
      if constexpr (F::kVFirst) {
        o[0] += __shfl_xor_sync(0xffffffffu, o[0], 1);
        o[0] += __shfl_xor_sync(0xffffffffu, o[0], 2);
        if (lane % 4 == 0) store_f(out, out_row + lane / 4, o[0], p.out.f32);
      } else {
        reduce_scatter<F::NJ, F::kLaneBits>(o, lane);
        const int writer_mask = F::E == 4 ? 6 : 3;  // one lane per column
        if ((lane & writer_mask) == 0) store_f(out, out_row + F::col(scatter_index<F::NJ>(lane), lane), o[0], p.out.f32);
      }

      // The state after this token, where it is kept.
      int64_t dst = -1;
      if (p.index_kind == IndexKind::PerToken) dst = st.slot[tt];
      else if (g0 + tt == len - 1 && p.state_out != nullptr) dst = slot_in;
      if (dst >= 0) {
        PoolT* s = static_cast<PoolT*>(p.state_out) + dst * p.out_slot_stride + hv * kHeadElems;
#pragma unroll
        for (int c = 0; c < F::NC; ++c) {
          uint4 w;
          if constexpr (sizeof(PoolT) == 4) {
            w = make_uint4(__float_as_uint(f[c][0]), __float_as_uint(f[c][1]), __float_as_uint(f[c][2]),
                           __float_as_uint(f[c][3]));
          } else {
            w = make_uint4(pack_bf16(f[c][0], f[c][1]), pack_bf16(f[c][2], f[c][3]), pack_bf16(f[c][4], f[c][5]),
                           pack_bf16(f[c][6], f[c][7]));
          }
          *reinterpret_cast<uint4*>(s + F::offset(c, lane, col0)) = w;
        }
      }
    }
  };

  // The first round is peeled so that the raw state registers are dead in later rounds.
  int cnt = int(len < tg ? len : tg);
  stage(0, cnt);
  __syncthreads();
  // The state loads have landed by now (or soon): widen them to fp32.
#pragma unroll
  for (int c = 0; c < F::NC; ++c) {
    if constexpr (sizeof(PoolT) == 4) {
      f[c][0] = __uint_as_float(raw[c].x), f[c][1] = __uint_as_float(raw[c].y);
      f[c][2] = __uint_as_float(raw[c].z), f[c][3] = __uint_as_float(raw[c].w);
    } else {
      const uint32_t w[4] = {raw[c].x, raw[c].y, raw[c].z, raw[c].w};
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float2 t = unpack_bf16(w[x]);
        f[c][2 * x] = t.x, f[c][2 * x + 1] = t.y;
      }
    }
  }
  run(0, cnt);
#pragma unroll 1
  for (int64_t g0 = tg; g0 < len; g0 += tg) {
    cnt = int(len - g0 < tg ? len - g0 : tg);
    __syncthreads();  // the previous round's staging is no longer read
    stage(g0, cnt);
    __syncthreads();
    run(g0, cnt);
  }
}

template <StateLayout L, typename PoolT>
cudaError_t launch_gate(GateMode gate, const KernelLaunch& k, uint64_t ctx, const DecodeParams& p, cudaStream_t stream) {
  switch (gate) {
    case GateMode::SafeSigmoid: return launch_planned<decode_kernel<L, PoolT, GateMode::SafeSigmoid>>(k, ctx, p, stream);
    case GateMode::Softplus: return launch_planned<decode_kernel<L, PoolT, GateMode::Softplus>>(k, ctx, p, stream);
    default: return launch_planned<decode_kernel<L, PoolT, GateMode::PreGated>>(k, ctx, p, stream);
  }
}

ActView act(const TensorView& t) {
  ActView a;
  a.data = t.data;
  a.batch = t.strides[0];
  a.token = t.strides[1];
  a.head = t.strides[2];
  a.f32 = t.dtype == DType::F32;
  return a;
}

}  // namespace

void launch_decode(const DecodeArgs& a, const ProblemShape& ps, Stream stream) {
  const int device = a.q.device_id;
  DeviceGuard guard(device);
  uint64_t ctx = 0;
  const DeviceProps props = sm90_stream_props(device, stream, &ctx);
  const DecodePlan plan = make_decode_plan(ps, props);

  DecodeParams p;
  p.q = act(a.q);
  p.k = act(a.k);
  p.v = act(a.v);
  p.g = act(a.g);
  p.beta = act(a.beta);
  p.out = act(a.out);
  p.A_log = a.gate != GateMode::PreGated && a.A_log.defined() ? static_cast<const float*>(a.A_log.data) : nullptr;
  p.dt_bias = a.gate != GateMode::PreGated && a.dt_bias.defined() ? static_cast<const float*>(a.dt_bias.data) : nullptr;
  p.seq.cu_seqlens = ps.varlen ? a.cu_seqlens.data : nullptr;
  p.seq.cu_is_64 = a.cu_seqlens.dtype == DType::I64;
  p.seq.seqlen = ps.seqlen;
  p.seq.num_seqs = ps.num_seqs;
  p.seq.total_tokens = ps.batch * ps.seqlen;
  if (a.initial_state.defined()) {
    p.state_in = a.initial_state.data;
    p.in_slot_stride = a.initial_state.strides[0];
  }
  if (a.final_state.defined()) {
    p.state_out = a.final_state.data;
    p.out_slot_stride = a.final_state.strides[0];
  }
  const TensorView& idx = a.ssm_state_indices;
  if (idx.defined()) {
    p.index_kind = idx.ndim == 2 ? IndexKind::PerToken : IndexKind::PerSeq;
    p.indices = idx.data;
    p.indices_64 = idx.dtype == DType::I64;
    p.idx_seq_stride = idx.strides[0];
    p.idx_tok_stride = idx.ndim == 2 ? idx.strides[1] : 0;
    p.pool_slots = a.initial_state.shape[0];
    if (a.num_accepted_tokens.defined()) {
      p.accepted = a.num_accepted_tokens.data;
      p.accepted_64 = a.num_accepted_tokens.dtype == DType::I64;
      p.acc_stride = a.num_accepted_tokens.strides[0];
    }
  }
  p.value_heads = int(ps.value_heads);
  p.group = int(ps.value_heads / ps.heads);
  p.scale = float(ps.scale);
  p.lower_bound = float(a.lower_bound);
  p.l2norm = a.use_qk_l2norm;
  p.beta_sigmoid = a.use_beta_sigmoid;
  p.neg_eigval = a.allow_neg_eigval;
  p.slices = plan.slices;
  p.token_group = plan.token_group;

  const TensorView& state = a.initial_state.defined() ? a.initial_state : a.final_state;
  const bool bf16_pool = state.defined() && state.dtype == DType::BF16;
  cudaError_t e;
  if (a.state_layout == StateLayout::VFirst)
    e = bf16_pool ? launch_gate<StateLayout::VFirst, __nv_bfloat16>(a.gate, plan.launch, ctx, p, stream)
                  : launch_gate<StateLayout::VFirst, float>(a.gate, plan.launch, ctx, p, stream);
  else
    e = bf16_pool ? launch_gate<StateLayout::KFirst, __nv_bfloat16>(a.gate, plan.launch, ctx, p, stream)
                  : launch_gate<StateLayout::KFirst, float>(a.gate, plan.launch, ctx, p, stream);
  check_cuda(e, "decode kernel launch");
}

}  // namespace flash_kda::sm90
