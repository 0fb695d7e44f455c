// The sm_90a direct decode kernel for k-first [K, V] states (v-first ones: direct_vfirst.cu):
// the same call as the persistent kernel (decode.cu, semantics in include/flash_kda/decode.h),
// one block per work item with the item's state slice held in registers from its first
// instructions to its last store.
//
// Why this shape. The call moves the states' bytes and little else, so an SM must keep enough
// state reads in flight (~32 KB at 4.25 TB/s and ~1 us of loaded latency). Here a block's first
// instructions resolve its slot index and then issue every 16-byte load of its slice at once,
// global -> registers; the token inputs are staged in shared memory (normalised, gated) while
// those loads are in flight. At <= 128 registers a lane 4 blocks of 128 threads share an SM.
// Per token (fp32 math): S <- diag(exp(a)) S; u = b (v - S^T k); S += k u^T; o = S^T q,
// evaluated as o = S_dec^T q + (k . q) u so that both reductions run over the decayed state in
// one pass.
// - k-first [K, V] (row = key, contiguous over V): a block owns 32 value columns, a warp 32 key
//   rows of them; a lane holds 16-byte vectors along V (fp32: 4 columns of 8 rows; bf16: 8
//   columns of 4 rows). The sums over K run in the thread, then a reduce-scatter over the
//   lanes of the same columns, then across the 4 warps through a small shared buffer (two
//   token parities, one barrier per token): the reason this layout stages its tokens once per
//   block instead of per warp.
// - Pool semantics as decode.cu: the start slot decides a skip (negative or >= P: zero rows of
//   out, no state access); [N, T] indices send each token's state to its own valid slot.
// Modes: pool dtype and gate mode are template parameters (6 kernels); input dtypes, index
// kind and the beta / norm flags are uniform runtime branches of the staging.
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

/// A lane's part of its block's k-first state slice: NR 16-byte vectors of E pool elements.
template <typename PoolT>
struct DirectFrag {
  static constexpr int E = 16 / int(sizeof(PoolT));
  /// Lanes per 32-column row segment (8 fp32, 4 bf16).
  static constexpr int LPR = kDirectBlockCols / E;
  static constexpr int RPI = 32 / LPR;  // rows one warp instruction covers
  static constexpr int NR = 32 / RPI;   // vectors a lane
  static_assert(NR * E == 32, "32 state elements a lane");

  /// The lane's first block-local value column.
  __device__ static int lane_elem(int lane) { return (lane % LPR) * E; }
  /// Key row of vector c.
  __device__ static int row(int c, int warp, int lane) { return warp * 32 + c * RPI + lane / LPR; }
  /// Element offset of vector c within the head's state; col0 = the block's first value index.
  __device__ static int64_t offset(int c, int warp, int lane, int col0) {
    return int64_t(row(c, warp, lane)) * kD + col0 + lane_elem(lane);
  }
};

/// The block's staged tokens (direct_smem_bytes): the partial sums first, then q, k, decay, the
/// block's v columns, b and k . q per token, each token's pool slot.
struct DirectStaging {
  float* red;     // [2][4 warps][64] partial sums
  float* q;       // [tg][128] scale * q (normalised)
  float* k;       // [tg][128] k (normalised)
  float* d;       // [tg][128] exp(a)
  float* v;       // [tg][block_cols]
  float* b;       // [tg] beta after its activation
  float* kq;      // [tg] k . (scale q) of the finished rows
  int64_t* slot;  // [tg] pool slot the token's state goes to (PerToken), -1: none
  __device__ DirectStaging(char* base, int tg, int cols) {
    red = reinterpret_cast<float*>(base);
    q = red + kDirectReduceBytes / 4;
    k = q + tg * kD;
    d = k + tg * kD;
    v = d + tg * kD;
    b = v + tg * cols;
    kq = b + tg;
    slot = reinterpret_cast<int64_t*>(b + ((2 * tg + 1) & ~1));
  }
};

__device__ __forceinline__ uint4 load_state(const void* p) {
  return __ldcg(reinterpret_cast<const uint4*>(p));
}

template <typename PoolT, GateMode Gate>
__global__ void __launch_bounds__(128, kDirectMinBlocks) direct_kernel(const DecodeParams p) {
  using F = DirectFrag<PoolT>;
  constexpr int E = F::E, NR = F::NR;
  constexpr int64_t kHeadElems = int64_t(kD) * kD;
  extern __shared__ __align__(16) char smem[];
  const int warps = int(blockDim.x) / 32;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int cols = kDirectBlockCols;
  const int tg = p.token_group;
  const DirectStaging st(smem, tg, cols);
  const bool varlen = p.seq.cu_seqlens != nullptr;
  const int64_t items = p.seq.num_seqs * p.value_heads * p.slices;
  const ptx::FastMath fm;
  void* const out = const_cast<void*>(p.out.data);
  int parity = 0;  // which half of the partial-sum buffer the next token uses

#pragma unroll 1
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    // The item: value columns col0 .. col0 + cols - 1 of value head hv of sequence n.
    const int slice = int(w % p.slices);
    const int64_t nh = w / p.slices;
    const int hv = int(nh % p.value_heads);
    const int64_t n = nh / p.value_heads;
    const int col0 = slice * cols;
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

    // Every load of the lane's state vectors, at once (consumed after the staging).
    uint4 raw[NR];
    const bool load = !skip && p.state_in != nullptr && (len > 0 || p.state_out != nullptr);
    if (load) {
      const PoolT* s = static_cast<const PoolT*>(p.state_in) + slot * p.in_slot_stride + hv * kHeadElems;
#pragma unroll
      for (int c = 0; c < NR; ++c) raw[c] = load_state(s + F::offset(c, warp, lane, col0));
    } else {
#pragma unroll
      for (int c = 0; c < NR; ++c) raw[c] = make_uint4(0u, 0u, 0u, 0u);
    }

    if (skip) {
      // Padded: zero rows of out, no state read or written.
      for (int64_t e = tid; e < len * cols; e += blockDim.x) {
        const int64_t t = e / cols;
        store_f(out, bat * p.out.batch + (tok0 + t) * p.out.token + hv * p.out.head + col0 + int(e % cols), 0.f,
                p.out.f32);
      }
      continue;  // uniform over the block
    }

    float f[NR][E];
    auto unpack = [&]() {
#pragma unroll
      for (int c = 0; c < NR; ++c) unpack_vec<PoolT>(raw[c], f[c]);
    };
    // The lane's vectors of the current state to pool slot (or final_state row) dst.
    auto store_state = [&](int64_t dst) {
      PoolT* s = static_cast<PoolT*>(p.state_out) + dst * p.out_slot_stride + hv * kHeadElems;
#pragma unroll
      for (int c = 0; c < NR; ++c) *reinterpret_cast<uint4*>(s + F::offset(c, warp, lane, col0)) = pack_vec<PoolT>(f[c]);
    };

    if (len == 0) {
      // A sequence of no tokens (varlen, no pool) passes its start state through.
      unpack();
      if (p.state_out != nullptr) store_state(slot);
      continue;
    }

    const int h = hv / p.group;
    // Staging of tokens g0 .. g0 + cnt - 1: warp tt finishes token tt (lane: channels 4 lane .. + 3).
    auto stage = [&](int64_t g0, int cnt) {
      if (warp < cnt) {
        float bias[4] = {0.f, 0.f, 0.f, 0.f};
        math::SafeGateLog2<float> safe{};
        float neg_rate = 0.f;
        if constexpr (Gate != GateMode::PreGated) {
          const float a_log = p.A_log != nullptr ? p.A_log[hv] : 0.f;
          if (p.dt_bias != nullptr) {
            const float4 b4 = *reinterpret_cast<const float4*>(p.dt_bias + int64_t(hv) * kD + 4 * lane);
            bias[0] = b4.x, bias[1] = b4.y, bias[2] = b4.z, bias[3] = b4.w;
          }
          if constexpr (Gate == GateMode::SafeSigmoid) {
            safe = math::safe_gate_log2_head(a_log, p.lower_bound, fm);
#pragma unroll
            for (int c = 0; c < 4; ++c) bias[c] *= safe.rate2;  // bias2 = rate2 dt_bias
          } else {
            neg_rate = -fm.exp(a_log);
          }
        }
#pragma unroll 1
        for (int tt = warp; tt < cnt; tt += warps) {
          const int64_t row = tok0 + g0 + tt;
          float4 q4 = load4(p.q.data, bat * p.q.batch + row * p.q.token + h * p.q.head + 4 * lane, p.q.f32);
          float4 k4 = load4(p.k.data, bat * p.k.batch + row * p.k.token + h * p.k.head + 4 * lane, p.k.f32);
          const float4 g4 = load4(p.g.data, bat * p.g.batch + row * p.g.token + hv * p.g.head + 4 * lane, p.g.f32);
          float4 v4 = make_float4(0.f, 0.f, 0.f, 0.f);
          if (4 * lane < cols)
            v4 = load4(p.v.data, bat * p.v.batch + row * p.v.token + hv * p.v.head + col0 + 4 * lane, p.v.f32);
          uint32_t beta_bits = 0;
          int64_t ws = -1;
          if (lane == 0) {
            beta_bits = load_beta_bits(p.beta, bat * p.beta.batch + row * p.beta.token + hv * p.beta.head);
            if (p.index_kind == IndexKind::PerToken)
              ws = load_index(p.indices, n * p.idx_seq_stride + (g0 + tt) * p.idx_tok_stride, p.indices_64);
          }
          float qs = p.scale, ks = 1.f;
          float dot = q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
          if (p.l2norm) {
            float sq = q4.x * q4.x + q4.y * q4.y + q4.z * q4.z + q4.w * q4.w;
            float sk = k4.x * k4.x + k4.y * k4.y + k4.z * k4.z + k4.w * k4.w;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
              sq += __shfl_xor_sync(0xffffffffu, sq, off);
              sk += __shfl_xor_sync(0xffffffffu, sk, off);
              dot += __shfl_xor_sync(0xffffffffu, dot, off);
            }
            qs *= ptx::rsqrt(sq + float(math::kL2NormEps));
            ks = ptx::rsqrt(sk + float(math::kL2NormEps));
          } else {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
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
          if (4 * lane < cols) *reinterpret_cast<float4*>(st.v + tt * cols + 4 * lane) = v4;
          if (lane == 0) {
            float bv = beta_value(beta_bits, p.beta.f32);
            if (p.beta_sigmoid) bv = math::beta_sigmoid_log2(bv, fm) * (p.neg_eigval ? 2.f : 1.f);
            st.b[tt] = bv;
            st.kq[tt] = dot * qs * ks;
            st.slot[tt] = ws < p.pool_slots ? ws : -1;
          }
        }
      }
    };
    // The recurrence over the staged tokens g0 .. g0 + cnt - 1: out rows and the kept states.
    auto run = [&](int64_t g0, int cnt) {
#pragma unroll 1
      for (int tt = 0; tt < cnt; ++tt) {
        const float b = st.b[tt], kq = st.kq[tt];
        const int64_t out_row = bat * p.out.batch + (tok0 + g0 + tt) * p.out.token + hv * p.out.head + col0;
        // k-first: the lane's columns j = lane_elem .. + E - 1; key rows row(c).
        const int cv = lane % F::LPR;
        float acc[2 * E];
#pragma unroll
        for (int e = 0; e < 2 * E; ++e) acc[e] = 0.f;
#pragma unroll
        for (int c = 0; c < NR; ++c) {
          const int i = F::row(c, warp, lane);
          const float di = st.d[tt * kD + i], ki = st.k[tt * kD + i], qi = st.q[tt * kD + i];
#pragma unroll
          for (int e = 0; e < E; ++e) {
            f[c][e] *= di;
            acc[e] = fmaf(f[c][e], ki, acc[e]);
            acc[E + e] = fmaf(f[c][e], qi, acc[E + e]);
          }
        }
        // Over the lanes of the same columns (lane bits 16 .. LPR): 2 sums a lane remain, sums
        // base and base + 1 of the 2E (S^T k of the E columns, then S^T q).
        constexpr int Bits = log2_int(F::RPI);
        reduce_scatter<2 * E, Bits>(acc, lane);
        int base = 0;
#pragma unroll
        for (int l = 0; l < Bits; ++l)
          if (lane & (16 >> l)) base += (2 * E) >> (l + 1);
        float* red = st.red + parity * (4 * 64);
        *reinterpret_cast<float2*>(red + warp * 64 + cv * (2 * E) + base) = make_float2(acc[0], acc[1]);
        __syncthreads();
        float u[E];
#pragma unroll
        for (int e = 0; e < E; ++e) u[e] = 0.f;
#pragma unroll
        for (int wi = 0; wi < 4; ++wi) {
          float t[E];
          load_row<E>(t, red + wi * 64 + cv * (2 * E));
#pragma unroll
          for (int e = 0; e < E; ++e) u[e] += t[e];
        }
        float vv[E];
        load_row<E>(vv, st.v + tt * cols + cv * E);
#pragma unroll
        for (int e = 0; e < E; ++e) u[e] = b * (vv[e] - u[e]);
        if (warp == 0 && lane < F::LPR) {
          float o[E];
#pragma unroll
          for (int e = 0; e < E; ++e) o[e] = kq * u[e];
#pragma unroll
          for (int wi = 0; wi < 4; ++wi) {
            float t[E];
            load_row<E>(t, red + wi * 64 + cv * (2 * E) + E);
#pragma unroll
            for (int e = 0; e < E; ++e) o[e] += t[e];
          }
#pragma unroll
          for (int e = 0; e < E; ++e) store_f(out, out_row + cv * E + e, o[e], p.out.f32);
        }
#pragma unroll
        for (int c = 0; c < NR; ++c) {
          const float ki = st.k[tt * kD + F::row(c, warp, lane)];
#pragma unroll
          for (int e = 0; e < E; ++e) f[c][e] = fmaf(ki, u[e], f[c][e]);
        }
        parity ^= 1;

        // The state after this token, where it is kept.
        int64_t dst = -1;
        if (p.index_kind == IndexKind::PerToken) dst = st.slot[tt];
        else if (g0 + tt == len - 1 && p.state_out != nullptr) dst = slot;
        if (dst >= 0) store_state(dst);
      }
    };

    // The first group is staged while the state loads are in flight; `raw` is dead after it.
    int cnt = int(len < tg ? len : tg);
    stage(0, cnt);
    unpack();  // the state loads are first waited for here
    __syncthreads();
    run(0, cnt);
#pragma unroll 1
    for (int64_t g0 = tg; g0 < len; g0 += tg) {
      cnt = int(len - g0 < tg ? len - g0 : tg);
      __syncthreads();  // the previous group's staging is no longer read
      stage(g0, cnt);
      __syncthreads();
      run(g0, cnt);
    }
    __syncthreads();  // the next item's staging waits for this item's last reads
  }
}

template <typename PoolT>
cudaError_t launch_gate(GateMode gate, const KernelLaunch& k, uint64_t ctx, const DecodeParams& p, cudaStream_t stream) {
  switch (gate) {
    case GateMode::SafeSigmoid: return launch_planned<direct_kernel<PoolT, GateMode::SafeSigmoid>>(k, ctx, p, stream);
    case GateMode::Softplus: return launch_planned<direct_kernel<PoolT, GateMode::Softplus>>(k, ctx, p, stream);
    default: return launch_planned<direct_kernel<PoolT, GateMode::PreGated>>(k, ctx, p, stream);
  }
}

}  // namespace

cudaError_t launch_direct(StateLayout layout, bool bf16_pool, GateMode gate, const DecodePlan& plan, uint64_t ctx,
                          const DecodeParams& p, cudaStream_t stream) {
  if (layout == StateLayout::VFirst) return launch_direct_vfirst(bf16_pool, gate, plan, ctx, p, stream);
  return bf16_pool ? launch_gate<__nv_bfloat16>(gate, plan.launch, ctx, p, stream)
                   : launch_gate<float>(gate, plan.launch, ctx, p, stream);
}

}  // namespace flash_kda::sm90
