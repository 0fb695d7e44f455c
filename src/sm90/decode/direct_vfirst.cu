// The sm_90a direct decode kernel for v-first [V, K] states: the same call as the persistent
// kernel (decode.cu, semantics in include/flash_kda/decode.h), one block per work item, and
// inside it every warp runs its own value rows of the item from its first load to its last
// store, with no shared memory and no block barrier.
//
// Why this shape. The call moves the states' bytes and little else, so an SM must keep state
// reads in flight all the time (~32 KB at 4.25 TB/s and ~1 us of loaded latency). A block that
// stages the tokens once for all its warps makes every warp wait at a barrier for the one that
// staged (the H200 profile of that form: half of the warps' stall cycles at the barrier, DRAM
// 58% busy at 1024 x 32 fp32). Here each warp loads the few input elements its lanes use (E keys
// of q, k, g and one element of v per lane), finishes them with warp shuffles (the L2 norms
// over the lanes of a row) while its state loads are in flight, and warps drift apart freely,
// so that some warp of the SM is always waiting on state bytes while others compute. Token t + 1's
// inputs are loaded (raw bits into registers) before token t runs.
// - Fragment: a warp owns value rows, all 128 keys of them: an fp32 lane holds keys 4 lane .. + 3
//   of the warp's 8 rows (one 512-byte row per warp instruction), a bf16 lane keys 8 (lane %
//   16) .. + 7 of half of them (two rows per instruction: 4 of 8 rows, or 8 of 16 in the packed
//   form; the forms: the kernel's comment).
// - Per token (fp32 math): S <- diag(exp(a)) S; u = b (v - S^T k); S += k u^T; o = S^T q,
//   evaluated as o = S_dec^T q + (k . q) u so that both reductions run over the decayed state
//   in one pass. The 2 x 8 row sums (S^T k, S^T q) are one reduce-scatter over the lanes of a
//   row, after which lane pairs hold S^T k and S^T q of one row; one exchange gives each both,
//   and every lane gets each row's u from the lane that computed it.
// - Pool semantics as decode.cu: the start slot decides a skip (negative or >= P: zero rows of
//   out, no state access); [N, T] indices send each token's state to its own valid slot.
// Modes: pool dtype, gate mode and one token a sequence (kOneToken) are template parameters (12
// kernels); input dtypes, index kind and the beta / norm flags are uniform run-time branches.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gate.h"
#include "sm90/common/bf16.cuh"
#include "sm90/common/launch_config.h"
#include "sm90/common/ptx.cuh"
#include "sm90/decode/direct.h"
#include "sm90/decode/fragment.cuh"
#include "sm90/decode/params.h"
#include "sm90/decode/plan.h"
#include "sm90/decode/staging.cuh"

namespace flash_kda::sm90 {
namespace {

using namespace decode_detail;

/// A lane's part of its warp's kRows value rows: NR 16-byte vectors of E pool elements.
template <typename PoolT, int kRows>
struct RowFrag {
  static constexpr int E = 16 / int(sizeof(PoolT));
  static constexpr int LPR = kD / E;   // lanes per 128-key row: 32 fp32, 16 bf16
  static constexpr int Top = LPR / 2;  // the lane bit that splits S^T k from S^T q
  static constexpr int RPI = 32 / LPR;  // rows one warp instruction covers
  static constexpr int NR = kRows / RPI;  // vectors a lane
  /// Lanes of a half row group that end with the same row sum (reduce_scatter leaves NR
  /// sums over Top lanes): 2 for 8 rows, 1 for 16 bf16 rows.
  static constexpr int kDup = Top / NR > 1 ? Top / NR : 1;
  static_assert(NR <= Top, "a row sum per lane pair at most");
  /// The lane's first key.
  __device__ static int key0(int lane) { return (lane % LPR) * E; }
  /// Warp-local value row of vector c.
  __device__ static int row(int c, int lane) { return c * RPI + lane / LPR; }
  /// The warp-local row whose sums the lane ends with (reduce_scatter's order).
  __device__ static int own_row(int lane) { return ((lane & (Top - 1)) / kDup) * RPI + lane / LPR; }
  /// The lane that ends with the sums of this lane's vector c.
  __device__ static int holder(int c, int lane) { return (lane & ~(LPR - 1)) | (c * kDup); }
};

/// E consecutive input elements (bf16 or fp32) as raw bits: E * 2 or E * 4 bytes, 16-byte
/// vector loads (8-byte for 4 bf16), converted only where they are used (finish_vec), so that
/// a load issued ahead of the token before it never stalls the warp at a conversion.
template <int E>
struct RawVec {
  uint4 r[E == 8 ? 2 : 1];
};

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

/// Sum of x over the LPR lanes of a row (lane bits LPR / 2 .. 1).
template <int LPR>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int off = LPR / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

/// One token's inputs as this lane loaded them.
template <int E>
struct TokenRaw {
  RawVec<E> q, k, g;
  uint32_t v_bits;     // v at the lane's own row (decode: u is computed there)
  uint32_t beta_bits;
  int64_t slot;        // PerToken: the pool slot its state goes to
};

/// One token finished for this lane: scale * q and k normalised, the decays of its E keys, b,
/// k . (scale q) and its v.
template <int E>
struct Token {
  float q[E], k[E], d[E];
  float b, kq, v;
  int64_t slot;
};

/// The forms (a warp owns all 128 keys of its value rows):
/// - 8 rows a warp, held in fp32 across the tokens (fp32 pools; bf16 pools with more than one
///   token a sequence), token t + 1's inputs loaded into registers while token t runs.
/// - bf16 pool, kOneToken (fixed length T = 1, the packed form): 16 rows a warp, kept as the
///   loaded bf16 vectors and decayed and updated in fp32 as they are read (the state is rounded
///   once, at its store, as in the other form), so that a lane's 64 elements fit in 32
///   registers: a bf16 warp of 8 rows has half the bytes of an fp32 one in flight for the same
///   latency and instructions, which holds a bf16 pool at ~1.9x of the floor where fp32 sits
///   at ~1.1x (docs/performance.md, "Decode").
template <typename PoolT, GateMode Gate, bool kOneToken>
__global__ void __launch_bounds__(128, kDirectMinBlocks)
    direct_vfirst_kernel(const DecodeParams p) {
  constexpr bool kPacked = kOneToken && sizeof(PoolT) == 2;
  constexpr int kRows = direct_vfirst_rows(int(sizeof(PoolT)), kOneToken);  // rows a warp owns
  static_assert(kRows == (kPacked ? 2 * kDirectWarpRows : kDirectWarpRows), "the forms above");
  using F = RowFrag<PoolT, kRows>;
  constexpr int E = F::E, NR = F::NR, LPR = F::LPR, Top = F::Top;
  constexpr int64_t kHeadElems = int64_t(kD) * kD;
  const int warps = int(blockDim.x) / 32;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int cols = warps * kRows;
  const bool varlen = p.seq.cu_seqlens != nullptr;
  const int64_t items = p.seq.num_seqs * p.value_heads * p.slices;
  const ptx::FastMath fm;
  void* const out = const_cast<void*>(p.out.data);
  const int kb = F::key0(lane);
  const int r_own = F::own_row(lane);

#pragma unroll 1
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    // The item: value rows col0 .. col0 + cols - 1 of value head hv of sequence n; this warp's
    // are row0 .. row0 + kRows - 1.
    const int slice = int(w % p.slices);
    const int64_t nh = w / p.slices;
    const int hv = int(nh % p.value_heads);
    const int64_t n = nh / p.value_heads;
    const int row0 = slice * cols + warp * kRows;
    const int64_t tok0 = varlen ? p.seq.start(n) : 0;
    const int64_t len = varlen ? p.seq.length(n) : p.seq.seqlen;
    const int64_t bat = varlen ? 0 : n;
    int64_t slot = n;
    bool skip = false;
    if (p.index_kind != IndexKind::None) {
      int64_t t_start = 0;
      if (p.accepted != nullptr) {
        t_start = load_index(p.accepted, n * p.acc_stride, p.accepted_64) - 1;
        t_start = t_start < 0 ? 0 : (t_start >= p.seq.seqlen ? p.seq.seqlen - 1 : t_start);
      }
      slot = load_index(p.indices, n * p.idx_seq_stride + t_start * p.idx_tok_stride, p.indices_64);
      skip = len == 0 || slot < 0 || slot >= p.pool_slots;
    }

    // Every load of the lane's state vectors, at once (first waited for after token 0's inputs).
    uint4 raw[NR];
    const bool load = !skip && p.state_in != nullptr && (len > 0 || p.state_out != nullptr);
    if (load) {
      const PoolT* s = static_cast<const PoolT*>(p.state_in) + slot * p.in_slot_stride + hv * kHeadElems;
#pragma unroll
      for (int c = 0; c < NR; ++c)
        raw[c] = __ldcg(reinterpret_cast<const uint4*>(s + int64_t(row0 + F::row(c, lane)) * kD + kb));
    } else {
#pragma unroll
      for (int c = 0; c < NR; ++c) raw[c] = make_uint4(0u, 0u, 0u, 0u);
    }

    if (skip) {  // padded: zero rows of out, no state read or written
      const int64_t base = bat * p.out.batch + hv * p.out.head + row0;
      for (int64_t e = lane; e < len * kRows; e += 32)
        store_f(out, base + (tok0 + e / kRows) * p.out.token + int(e % kRows), 0.f, p.out.f32);
      continue;
    }

    // The gate's per-head constants and this lane's E channels of dt_bias.
    const int h = hv / p.group;
    float bias[E];
#pragma unroll
    for (int e = 0; e < E; ++e) bias[e] = 0.f;
    math::SafeGateLog2<float> safe{};
    float neg_rate = 0.f;
    if constexpr (Gate != GateMode::PreGated) {
      const float a_log = p.A_log != nullptr ? p.A_log[hv] : 0.f;
      if (p.dt_bias != nullptr) {
        RawVec<E> b = load_vec<E>(p.dt_bias, int64_t(hv) * kD + kb, true);
        finish_vec<E>(b, true, bias);
      }
      if constexpr (Gate == GateMode::SafeSigmoid) {
        safe = math::safe_gate_log2_head(a_log, p.lower_bound, fm);
#pragma unroll
        for (int e = 0; e < E; ++e) bias[e] *= safe.rate2;  // bias2 = rate2 dt_bias
      } else {
        neg_rate = -fm.exp(a_log);
      }
    }

    auto load_token = [&](int64_t t) {
      TokenRaw<E> x;
      const int64_t row = tok0 + t;
      x.q = load_vec<E>(p.q.data, bat * p.q.batch + row * p.q.token + h * p.q.head + kb, p.q.f32);
      x.k = load_vec<E>(p.k.data, bat * p.k.batch + row * p.k.token + h * p.k.head + kb, p.k.f32);
      x.g = load_vec<E>(p.g.data, bat * p.g.batch + row * p.g.token + hv * p.g.head + kb, p.g.f32);
      const int64_t vi = bat * p.v.batch + row * p.v.token + hv * p.v.head + row0 + r_own;
      x.v_bits = p.v.f32 ? static_cast<const uint32_t*>(p.v.data)[vi]
                         : uint32_t(static_cast<const unsigned short*>(p.v.data)[vi]);
      x.beta_bits = load_beta_bits(p.beta, bat * p.beta.batch + row * p.beta.token + hv * p.beta.head);
      x.slot = p.index_kind == IndexKind::PerToken
                   ? load_index(p.indices, n * p.idx_seq_stride + t * p.idx_tok_stride, p.indices_64)
                   : -1;
      return x;
    };
    auto finish_token = [&](const TokenRaw<E>& x) {
      Token<E> y;
      finish_vec<E>(x.q, p.q.f32, y.q);
      finish_vec<E>(x.k, p.k.f32, y.k);
      float gin[E];
      finish_vec<E>(x.g, p.g.f32, gin);
      float qs = p.scale, ks = 1.f;
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) dot = fmaf(y.q[e], y.k[e], dot);
      if (p.l2norm) {
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) sq = fmaf(y.q[e], y.q[e], sq), sk = fmaf(y.k[e], y.k[e], sk);
        sq = row_sum<LPR>(sq);
        sk = row_sum<LPR>(sk);
        qs *= ptx::rsqrt(sq + float(math::kL2NormEps));
        ks = ptx::rsqrt(sk + float(math::kL2NormEps));
      }
      dot = row_sum<LPR>(dot);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        y.q[e] *= qs;
        y.k[e] *= ks;
        float a2;
        if constexpr (Gate == GateMode::SafeSigmoid) a2 = math::safe_gate_log2(gin[e], bias[e], safe, fm);
        else if constexpr (Gate == GateMode::Softplus) a2 = math::softplus_gate_log2(gin[e] + bias[e], neg_rate, fm);
        else a2 = gin[e] * float(math::kLog2e);
        y.d[e] = ptx::ex2(a2);
      }
      float bv = beta_value(x.beta_bits, p.beta.f32);
      if (p.beta_sigmoid) bv = math::beta_sigmoid_log2(bv, fm) * (p.neg_eigval ? 2.f : 1.f);
      y.b = bv;
      y.kq = dot * qs * ks;
      y.v = p.v.f32 ? __uint_as_float(x.v_bits) : __uint_as_float(x.v_bits << 16);
      y.slot = x.slot < p.pool_slots ? x.slot : -1;
      return y;
    };

    const int64_t out_base = bat * p.out.batch + hv * p.out.head + row0;
    // The state in fp32 (the packed form keeps `raw` instead).
    float f[kPacked ? 1 : NR][E];
    auto unpack = [&]() {
      if constexpr (!kPacked) {
#pragma unroll
        for (int c = 0; c < NR; ++c) unpack_vec<PoolT>(raw[c], f[c]);
      }
    };
    // The lane's vectors of the current state to pool slot (or final_state row) dst.
    auto store_state = [&](int64_t dst) {
      PoolT* s = static_cast<PoolT*>(p.state_out) + dst * p.out_slot_stride + hv * kHeadElems;
#pragma unroll
      for (int c = 0; c < NR; ++c) {
        uint4* d = reinterpret_cast<uint4*>(s + int64_t(row0 + F::row(c, lane)) * kD + kb);
        if constexpr (kPacked) *d = raw[c];
        else *d = pack_vec<PoolT>(f[c]);
      }
    };
    if (len == 0) {  // a sequence of no tokens (varlen, no pool) passes its start state through
      unpack();
      if (p.state_out != nullptr) store_state(slot);
      continue;
    }
    // One token on the registers: its out rows, and its state where it is kept.
    auto run = [&](const Token<E>& y, int64_t t) {
      // S <- diag(exp(a)) S and the lane's parts of S^T k and S^T q of row c, summed at once
      // with the partner lane (bit Top): lanes with the bit keep S^T q, the others S^T k (the
      // first level of a reduce-scatter of the 2 NR sums [S^T k, S^T q]).
      const bool upper = (lane & Top) != 0;
      float acc[NR];
#pragma unroll
      for (int c = 0; c < NR; ++c) {
        float x[E];
        if constexpr (kPacked) unpack_vec<PoolT>(raw[c], x);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          if constexpr (kPacked) x[e] *= y.d[e];
          else x[e] = f[c][e] *= y.d[e];
        }
        float ak = 0.f, aq = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          ak = fmaf(x[e], y.k[e], ak);
          aq = fmaf(x[e], y.q[e], aq);
        }
        acc[c] = (upper ? aq : ak) + __shfl_xor_sync(0xffffffffu, upper ? ak : aq, Top);
      }
      reduce_scatter<NR, log2_int(LPR) - 1, Top / 2>(acc, lane);
      // Lanes with bit Top hold S^T q of row r_own, their partners S^T k of the same row.
      const float mine = acc[0], other = __shfl_xor_sync(0xffffffffu, mine, Top);
      const float sk = upper ? other : mine, sq = upper ? mine : other;
      const float u = y.b * (y.v - sk);
      if (!upper && lane % F::kDup == 0)
        store_f(out, out_base + (tok0 + t) * p.out.token + r_own, sq + y.kq * u, p.out.f32);
      // S += k u^T with each row's u from the lane that holds it (packed: the decayed state
      // recomputed from the loaded vectors, the same fp32 values, then rounded once).
#pragma unroll
      for (int c = 0; c < NR; ++c) {
        const float uc = __shfl_sync(0xffffffffu, u, F::holder(c, lane));
        if constexpr (kPacked) {
          float x[E];
          unpack_vec<PoolT>(raw[c], x);
#pragma unroll
          for (int e = 0; e < E; ++e) x[e] = fmaf(y.k[e], uc, x[e] * y.d[e]);
          raw[c] = pack_vec<PoolT>(x);
        } else {
#pragma unroll
          for (int e = 0; e < E; ++e) f[c][e] = fmaf(y.k[e], uc, f[c][e]);
        }
      }
      int64_t dst = -1;
      if (p.index_kind == IndexKind::PerToken) dst = y.slot;
      else if (t == len - 1 && p.state_out != nullptr) dst = slot;
      if (dst >= 0) store_state(dst);
    };

    // Token 0 is finished while the state loads are in flight; each later token's loads are
    // issued before the token ahead of it runs.
    TokenRaw<E> next = load_token(0);
    Token<E> cur = finish_token(next);
    unpack();  // the state loads are first waited for here
    if constexpr (kOneToken) {
      run(cur, 0);
    } else {
#pragma unroll 1
      for (int64_t t = 0; t < len; ++t) {
        if (t + 1 < len) next = load_token(t + 1);
        run(cur, t);
        if (t + 1 < len) cur = finish_token(next);
      }
    }
  }
}

template <typename PoolT, bool kOneToken>
cudaError_t launch_gate(GateMode gate, const KernelLaunch& k, uint64_t ctx, const DecodeParams& p, cudaStream_t stream) {
  switch (gate) {
    case GateMode::SafeSigmoid:
      return launch_planned<direct_vfirst_kernel<PoolT, GateMode::SafeSigmoid, kOneToken>>(k, ctx, p, stream);
    case GateMode::Softplus:
      return launch_planned<direct_vfirst_kernel<PoolT, GateMode::Softplus, kOneToken>>(k, ctx, p, stream);
    default: return launch_planned<direct_vfirst_kernel<PoolT, GateMode::PreGated, kOneToken>>(k, ctx, p, stream);
  }
}

template <typename PoolT>
cudaError_t launch_tokens(bool one_token, GateMode gate, const KernelLaunch& k, uint64_t ctx, const DecodeParams& p,
                          cudaStream_t stream) {
  return one_token ? launch_gate<PoolT, true>(gate, k, ctx, p, stream) : launch_gate<PoolT, false>(gate, k, ctx, p, stream);
}

}  // namespace

cudaError_t launch_direct_vfirst(bool bf16_pool, GateMode gate, const DecodePlan& plan, uint64_t ctx,
                                 const DecodeParams& p, cudaStream_t stream) {
  return bf16_pool ? launch_tokens<__nv_bfloat16>(plan.one_token, gate, plan.launch, ctx, p, stream)
                   : launch_tokens<float>(plan.one_token, gate, plan.launch, ctx, p, stream);
}

}  // namespace flash_kda::sm90
