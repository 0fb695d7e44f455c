// The per-token input helpers of the direct decode kernels (direct_warp.cu, kfirst_rows.cu):
// a lane's consecutive keys of q, k, g (or dt_bias) as raw bits loaded ahead of their use, their
// conversion to fp32, the gate's per-head constants and per-key decay, and b from beta's bits.
// Device code.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "common/gate.h"
#include "sm90/common/bf16.cuh"
#include "sm90/common/ptx.cuh"
#include "sm90/decode/params.h"
#include "sm90/decode/staging.cuh"

namespace flash_kda::sm90::decode_detail {

/// E consecutive input elements (bf16 or fp32) as raw bits: E * 2 or E * 4 bytes, 16-byte
/// vector loads (8-byte for 4 bf16), converted only where they are used (finish_vec), so that
/// a load issued ahead of the token before it never stalls the warp at a conversion.
template <int E>
struct RawVec {
  static_assert(E == 4 || E == 8, "4 or 8 elements");
  uint4 r[E == 8 ? 2 : 1];
};

/// Elements i .. i + E - 1 of `base` (fp32 when `f32`, else bf16) as raw bits.
template <int E>
__device__ __forceinline__ RawVec<E> load_vec(const void* base, int64_t i, bool f32) {
  RawVec<E> x;
  if (f32) {
    const uint4* s = reinterpret_cast<const uint4*>(static_cast<const float*>(base) + i);
#pragma unroll
    for (int j = 0; j < E / 4; ++j) x.r[j] = s[j];
  } else if constexpr (E == 8) {
    x.r[0] = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(base) + i);
  } else {
    const uint2 t = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(base) + i);
    x.r[0] = make_uint4(t.x, t.y, 0u, 0u);
  }
  return x;
}

/// load_vec's bits as E fp32 values.
template <int E>
__device__ __forceinline__ void finish_vec(const RawVec<E>& x, bool f32, float (&v)[E]) {
  if (f32) {
#pragma unroll
    for (int j = 0; j < E / 4; ++j) {
      v[4 * j] = __uint_as_float(x.r[j].x), v[4 * j + 1] = __uint_as_float(x.r[j].y);
      v[4 * j + 2] = __uint_as_float(x.r[j].z), v[4 * j + 3] = __uint_as_float(x.r[j].w);
    }
  } else {
    const uint32_t w[4] = {x.r[0].x, x.r[0].y, x.r[0].z, x.r[0].w};
#pragma unroll
    for (int i = 0; i < E / 2; ++i) {
      const float2 t = unpack_bf16(w[i]);
      v[2 * i] = t.x, v[2 * i + 1] = t.y;
    }
  }
}

/// The gate's parameters as loaded, A_log[hv] (0 when absent) and a lane's NK consecutive
/// channels of dt_bias from key kb (raw bits), for GateHead. They do not depend on the slot, so
/// the kernels issue these loads with token 0's inputs, before the slot index.
template <GateMode Gate, int NK>
struct GateParamsRaw {
  float a_log = 0.f;
  RawVec<NK> bias{};

  __device__ __forceinline__ GateParamsRaw(const DecodeParams& p, int hv, int kb) {
    if constexpr (Gate != GateMode::PreGated) {
      if (p.A_log != nullptr) a_log = p.A_log[hv];
      if (p.dt_bias != nullptr) bias = load_vec<NK>(p.dt_bias, int64_t(hv) * kD + kb, true);
    }
  }
};

/// The gate's per-head constants and a lane's NK consecutive channels of dt_bias (safe gate:
/// pre-multiplied by its rate, bias2 = rate2 dt_bias), from which decay() gives exp(a) of a key.
template <GateMode Gate, int NK>
struct GateHead {
  float bias[NK];
  math::SafeGateLog2<float> safe{};
  float neg_rate = 0.f;

  /// From A_log[hv] (`a_log`, 0 when absent) and the lane's dt_bias bits (`bias_raw`, fp32;
  /// zero when `has_bias` is false).
  __device__ __forceinline__ GateHead(float a_log, const RawVec<NK>& bias_raw, bool has_bias, float lower_bound,
                                      const ptx::FastMath& fm) {
#pragma unroll
    for (int e = 0; e < NK; ++e) bias[e] = 0.f;
    if constexpr (Gate != GateMode::PreGated) {
      if (has_bias) finish_vec<NK>(bias_raw, true, bias);
      if constexpr (Gate == GateMode::SafeSigmoid) {
        safe = math::safe_gate_log2_head(a_log, lower_bound, fm);
#pragma unroll
        for (int e = 0; e < NK; ++e) bias[e] *= safe.rate2;
      } else {
        neg_rate = -fm.exp(a_log);
      }
    }
  }

  /// exp(a) of the lane's key e with gate input `gin` (pre-gated: gin is a itself).
  __device__ __forceinline__ float decay(float gin, int e, const ptx::FastMath& fm) const {
    float a2;
    if constexpr (Gate == GateMode::SafeSigmoid) a2 = math::safe_gate_log2(gin, bias[e], safe, fm);
    else if constexpr (Gate == GateMode::Softplus) a2 = math::softplus_gate_log2(gin + bias[e], neg_rate, fm);
    else a2 = gin * float(math::kLog2e);
    return ptx::ex2(a2);
  }
};

/// b of a token from beta's raw bits (load_bits): sigmoid(beta) (times 2 with neg_eigval) or
/// beta itself, as the call's flags say.
__device__ __forceinline__ float beta_value(uint32_t bits, const DecodeParams& p, const ptx::FastMath& fm) {
  float bv = bits_value(bits, p.beta.f32);
  if (p.beta_sigmoid) bv = math::beta_sigmoid_log2(bv, fm) * (p.neg_eigval ? 2.f : 1.f);
  return bv;
}

/// The pool slot sequence n starts from (num_accepted_tokens[n] - 1 clamped to [0, T), else
/// token 0 of [N, T] indices, else idx[n]; n itself without indices), and whether the sequence
/// is skipped (`skip`: no tokens with a pool, or a slot outside [0, P)).
__device__ __forceinline__ int64_t start_slot(const DecodeParams& p, int64_t n, int64_t len, bool& skip) {
  int64_t slot = n;
  skip = false;
  if (p.index_kind != IndexKind::None) {
    int64_t t_start = 0;
    if (p.accepted != nullptr) {
      t_start = load_index(p.accepted, n * p.acc_stride, p.accepted_64) - 1;
      t_start = t_start < 0 ? 0 : (t_start >= p.seq.seqlen ? p.seq.seqlen - 1 : t_start);
    }
    slot = load_index(p.indices, n * p.idx_seq_stride + t_start * p.idx_tok_stride, p.indices_64);
    skip = len == 0 || slot < 0 || slot >= p.pool_slots;
  }
  return slot;
}

}  // namespace flash_kda::sm90::decode_detail
