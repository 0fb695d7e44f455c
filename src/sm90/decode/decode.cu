// The sm_90a persistent decode kernel, and the launch of either decode kernel (the plan picks
// it; the direct kernel is in direct_warp.cu): the KDA recurrence for T = 1..16 tokens per sequence (varlen: any
// length), each (sequence, value head) state read once from its slot and written once per kept
// token. Semantics: include/flash_kda/decode.h.
//
// Why this shape. The call is bound by the state's bytes: a 128 x 128 state is 64 KB in fp32,
// 32 KB in bf16, against ~1.5 KB of q, k, g and v per token. So the kernel's job is to keep
// enough state bytes in flight on every SM, all the time, and to do little else. At ~4.25 TB/s
// and ~1-1.5 us of loaded latency an SM needs ~16-24 KB of state reads in flight (half of the
// traffic is the writes, which need no waiting).
// - Work split: a work item is 8 * warps value columns of one (sequence, value head) state, all
//   128 key rows of them; a warp owns 8 columns (32 elements per lane). Every reduction over K
//   then stays inside the warp (shuffles, no shared memory, no block barrier in the token
//   loop). Blocks are 4 warps (32 columns: 4 items per head) or, for small batches, 2 (16
//   columns: 8 items per head; plan.h).
// - Persistent grid with copies ahead: a block loops over work items (blockIdx.x, + gridDim.x,
//   ...) and keeps the next decode_stages items (1 for fp32 pools, 2 for bf16) in flight while it
//   computes one: their state slices, their tokens' raw q, k, g, v and the gate parameters go
//   to shared memory by cp.async, issued as soon as a slot is free. Each thread copies exactly
//   the bytes it later reads itself (its state fragment; the warp that copies a token also
//   finishes it), so a copy needs only the thread's own cp.async.wait_group, no barrier. The
//   item's header (its slot index, num_accepted_tokens, cu_seqlens, its tokens' beta and
//   per-token slots) is loaded into registers one iteration earlier still, so no dependent
//   global round trip sits between a block's items.
// - Per-lane fragment, 16-byte vectors of the pool's dtype (E = 4 fp32 or 8 bf16 elements):
//   v-first [V, K]: lane = (column r = lane / 4, quarter s = lane % 4), vector c holds keys
//   (4c + s) E .. + E - 1 of column r; a warp instruction reads 8 rows x 64 contiguous bytes.
//   k-first [K, V]: fp32: lane = (row group lane / 2, column half lane % 2), vector c holds
//   columns 4 (lane % 2) .. + 3 of key row lane / 2 + 16 c; bf16: vector c holds the warp's 8
//   columns of key row lane + 32 c. So each lane reduces over its own keys first; the rest of
//   the reduction is 2 shuffles (v-first) or a reduce-scatter + all-gather over the lanes that
//   share columns (k-first: 8 shuffles for fp32, 16 for bf16, instead of 16 and 40 for a
//   plain all-reduce of every column). In shared memory the fragment is [vector][thread], so a
//   warp's reads of it are conflict-free.
// - Per token (fp32 math whatever the pool dtype): S <- diag(exp(a)) S; u = b (v - S^T k);
//   S += k u^T; o = S^T (scale q). The token's q, k (normalised), exp(a) (the gate's 128 exps),
//   b and the block's v columns are finished once per item in its staging slot (one warp per
//   token, norms by warp shuffles), for up to 16 tokens at once (fixed length: all T; varlen:
//   rounds of 4, the later rounds loaded directly, as they are rare), then one barrier; the
//   token loop reads them as broadcasts.
// - Pool semantics: the start slot decides a skip (negative or >= P: zero rows of out, no state
//   access); with [N, T] indices each token's state goes to its own slot when that is valid.
// Bytes: the floor's exactly (one read + one write of each state, T writes with [N, T]);
// registers: <= 128 per lane (4 blocks of 4 warps per SM), shared memory: plan.h.
// Modes: layout and pool dtype are template parameters (they shape the fragment and the
// pipeline depth), and so is the gate mode (3); input dtypes, the index kind and the beta / norm
// flags are uniform runtime branches (cheap: they touch only the staging). 12 kernels in all.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include <cute/arch/copy_sm80.hpp>

#include "common/gate.h"
#include "sm90/common/bf16.cuh"
#include "sm90/common/cuda_check.h"
#include "sm90/common/device_props.h"
#include "sm90/common/launch_config.h"
#include "sm90/common/ptx.cuh"
#include "sm90/decode/direct.h"
#include "sm90/decode/fragment.cuh"
#include "sm90/decode/gate_dispatch.h"
#include "sm90/decode/launch.h"
#include "sm90/decode/params.h"
#include "sm90/decode/plan.h"
#include "sm90/decode/staging.cuh"
#include "sm90/decode/token.cuh"

namespace flash_kda::sm90 {
namespace {

using namespace decode_detail;

static_assert(kDecodeVarlenGroup >= 4, "every warp of a 4-warp block stages a token of a long sequence's first group");

/// One work item: value columns col0 .. col0 + warps * 8 - 1 of value head hv of sequence n,
/// the same in every thread. Kept in its staging slot (one copy per warp) from its copies'
/// issue until it is computed, so that the items in flight hold no registers.
struct ItemHead {
  int64_t n = 0;     // sequence
  int64_t tok0 = 0;  // first token row (varlen: of the packed batch)
  int64_t len = 0;   // tokens of the sequence
  int64_t slot = 0;  // start slot: the state_in row read
  int hv = 0;        // value head
  int col0 = 0;      // the item's first value column
  int live = 0;      // 0: past the last work item
  int skip = 0;      // a pool call with a padded start slot (zero rows of out) or no tokens
};
static_assert(sizeof(ItemHead) == kDecodeItemHeadBytes, "plan.h sizes the staging slot's item headers");

/// An item as resolved, with this thread's token's header values (thread index < the tokens of
/// its first group).
struct Item {
  ItemHead h;
  int64_t ws = -1;         // its PerToken slot, or -1
  uint32_t beta_bits = 0;  // its raw beta (load_bits)
};

/// Item w of `items`, with its header loads issued (slot index, num_accepted_tokens, cu_seqlens,
/// and this thread's token's beta and PerToken slot when tid < its first group's tokens).
__device__ __forceinline__ Item resolve_item(const DecodeParams& p, int64_t w, int64_t items, int warps, int tid) {
  Item r;
  ItemHead& it = r.h;
  if (w >= items) return r;
  it.live = 1;
  const int slice = int(w % p.slices);
  const int64_t nh = w / p.slices;
  it.hv = int(nh % p.value_heads);
  it.n = nh / p.value_heads;
  it.col0 = slice * warps * kWarpCols;
  const bool varlen = p.seq.cu_seqlens != nullptr;
  it.tok0 = varlen ? p.seq.start(it.n) : 0;
  it.len = varlen ? p.seq.length(it.n) : p.seq.seqlen;
  it.slot = it.n;
  if (p.index_kind != IndexKind::None) {
    int64_t t_start = 0;
    if (p.accepted != nullptr) {
      t_start = load_index(p.accepted, it.n * p.acc_stride, p.accepted_64) - 1;
      t_start = t_start < 0 ? 0 : (t_start >= p.seq.seqlen ? p.seq.seqlen - 1 : t_start);
    }
    it.slot = load_index(p.indices, it.n * p.idx_seq_stride + t_start * p.idx_tok_stride, p.indices_64);
    it.skip = it.len == 0 || it.slot < 0 || it.slot >= p.pool_slots ? 1 : 0;
  }
  const int cnt = int(it.len < p.token_group ? it.len : p.token_group);
  if (!it.skip && tid < cnt) {
    const int64_t bat = varlen ? 0 : it.n;
    const int64_t row = it.tok0 + tid;
    r.beta_bits = load_bits(p.beta, bat * p.beta.batch + row * p.beta.token + it.hv * p.beta.head);
    if (p.index_kind == IndexKind::PerToken)
      r.ws = load_index(p.indices, it.n * p.idx_seq_stride + tid * p.idx_tok_stride, p.indices_64);
  }
  return r;
}

template <StateLayout L, typename PoolT, GateMode Gate>
__global__ void __launch_bounds__(128, decode_min_blocks(L)) decode_kernel(const DecodeParams p) {
  using F = Frag<L, PoolT>;
  constexpr int D = decode_stages(int(sizeof(PoolT)));  // items in flight behind the current one
  extern __shared__ __align__(16) char smem[];
  const int threads = int(blockDim.x);
  const int warps = threads / 32;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int tg = p.token_group;
  const int vcols = warps * kWarpCols;
  const bool varlen = p.seq.cu_seqlens != nullptr;
  const int64_t items = p.seq.num_seqs * p.value_heads * p.slices;
  const int64_t stride = gridDim.x;
  constexpr int64_t kHeadElems = int64_t(kD) * kD;

  // Shared memory: D state slots ([vector][thread] uint4), then D + 1 staging slots.
  uint4* const state_slots = reinterpret_cast<uint4*>(smem);
  char* const staging_base = smem + D * F::NC * threads * 16;
  const int slot_bytes = decode_slot_bytes(warps, tg);
  auto staging = [&](int64_t j) { return Staging(staging_base + int(j % (D + 1)) * slot_bytes, tg, warps); };
  auto state_slot = [&](int64_t j) { return state_slots + int(j % D) * F::NC * threads; };

  // Starts item `it`'s copies (its j-th item of this block): the state fragment, the raw token
  // rows of its first group (each by the warp that finishes them) and each staging warp's gate
  // parameters; beta and the per-token slots go to the slot from the header registers.
  auto issue = [&](const Item& r, int64_t j) {
    const ItemHead& it = r.h;
    const Staging st = staging(j);
    if (lane == 0) *reinterpret_cast<ItemHead*>(st.head + warp * kDecodeItemHeadBytes) = it;
    if (!it.live || it.skip) return;
    uint4* sb = state_slot(j);
    const int col0 = it.col0 + warp * kWarpCols;
    if (p.state_in != nullptr && (it.len > 0 || p.state_out != nullptr)) {
      const PoolT* s = static_cast<const PoolT*>(p.state_in) + it.slot * p.in_slot_stride + it.hv * kHeadElems;
#pragma unroll
      for (int c = 0; c < F::NC; ++c)
        cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>::copy(
            *reinterpret_cast<const cute::uint128_t*>(s + F::offset(c, lane, col0)),
            *reinterpret_cast<cute::uint128_t*>(sb + c * threads + tid));
    }
    if (it.len == 0) return;
    const int cnt = int(it.len < tg ? it.len : tg);
    const int64_t bat = varlen ? 0 : it.n;
    const int h = it.hv / p.group;
    if (warp < cnt && Gate != GateMode::PreGated) {
      float* par = st.par + warp * (kD + 4);
      if (p.dt_bias != nullptr) copy4_async(par, 4 * lane, p.dt_bias, int64_t(it.hv) * kD + 4 * lane, true);
      if (p.A_log != nullptr && lane == 0)
        cute::SM80_CP_ASYNC_CACHEALWAYS<uint32_t>::copy(*reinterpret_cast<const uint32_t*>(p.A_log + it.hv),
                                                         *reinterpret_cast<uint32_t*>(par + kD));
    }
#pragma unroll 1
    for (int tt = warp; tt < cnt; tt += warps) {
      const int64_t row = it.tok0 + tt;
      copy4_async(st.q + tt * kD, 4 * lane, p.q.data, bat * p.q.batch + row * p.q.token + h * p.q.head + 4 * lane, p.q.f32);
      copy4_async(st.k + tt * kD, 4 * lane, p.k.data, bat * p.k.batch + row * p.k.token + h * p.k.head + 4 * lane, p.k.f32);
      copy4_async(st.d + tt * kD, 4 * lane, p.g.data, bat * p.g.batch + row * p.g.token + it.hv * p.g.head + 4 * lane,
                  p.g.f32);
      if (4 * lane < vcols)
        copy4_async(st.v + tt * vcols, 4 * lane, p.v.data,
                    bat * p.v.batch + row * p.v.token + it.hv * p.v.head + it.col0 + 4 * lane, p.v.f32);
    }
    if (tid < cnt) {
      st.b[tid] = beta_value(r.beta_bits, p, ptx::FastMath{});
      st.slot[tid] = r.ws < p.pool_slots ? r.ws : -1;
    }
  };

  // Per-lane gate constants of an item for channels 4 lane .. 4 lane + 3, from a warp's copy of
  // its gate parameters (recomputed where needed rather than held across the token loop).
  const ptx::FastMath fm;
  struct GateConsts {
    float bias[4];
    math::SafeGateLog2<float> safe;
    float neg_rate;
  };
  auto gate_constants = [&](const float* par) {
    GateConsts gc{{0.f, 0.f, 0.f, 0.f}, {}, 0.f};
    const float a_log = p.A_log != nullptr ? par[kD] : 0.f;
    if (Gate != GateMode::PreGated && p.dt_bias != nullptr) {
      const float4 b4 = *reinterpret_cast<const float4*>(par + 4 * lane);
      gc.bias[0] = b4.x, gc.bias[1] = b4.y, gc.bias[2] = b4.z, gc.bias[3] = b4.w;
    }
    if constexpr (Gate == GateMode::SafeSigmoid) {
      gc.safe = math::safe_gate_log2_head(a_log, p.lower_bound, fm);
      for (int c = 0; c < 4; ++c) gc.bias[c] *= gc.safe.rate2;  // bias2 = rate2 dt_bias
    } else if constexpr (Gate == GateMode::Softplus) {
      gc.neg_rate = -fm.exp(a_log);
    }
    return gc;
  };
  // Token tt's q, k, g (lane's 4 channels) normalised, scaled and gated into its rows.
  auto finish = [&](const Staging& st, int tt, float4 q4, float4 k4, const float4 g4, const GateConsts& gc) {
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
      if constexpr (Gate == GateMode::SafeSigmoid) a2 = math::safe_gate_log2(gin[c], gc.bias[c], gc.safe, fm);
      else if constexpr (Gate == GateMode::Softplus) a2 = math::softplus_gate_log2(gin[c] + gc.bias[c], gc.neg_rate, fm);
      else a2 = gin[c] * float(math::kLog2e);
      dec[c] = ptx::ex2(a2);
    }
    *reinterpret_cast<float4*>(st.q + tt * kD + 4 * lane) = q4;
    *reinterpret_cast<float4*>(st.k + tt * kD + 4 * lane) = k4;
    *reinterpret_cast<float4*>(st.d + tt * kD + 4 * lane) = make_float4(dec[0], dec[1], dec[2], dec[3]);
  };
  // The first group of the current item, landed raw in its slot: finished in place by the warps
  // that copied it (each lane reads its own raw elements before the warp overwrites them).
  auto finish_copied = [&](const ItemHead& it, const Staging& st) {
    const int cnt = int(it.len < tg ? it.len : tg);
    if (warp >= cnt) return;
    __syncwarp();  // lane 0's copy of A_log is visible to the warp
    const GateConsts gc = gate_constants(st.par + warp * (kD + 4));
#pragma unroll 1
    for (int tt = warp; tt < cnt; tt += warps) {
      const float4 q4 = load4(st.q + tt * kD, 4 * lane, p.q.f32);
      const float4 k4 = load4(st.k + tt * kD, 4 * lane, p.k.f32);
      const float4 g4 = load4(st.d + tt * kD, 4 * lane, p.g.f32);
      float4 v4 = make_float4(0.f, 0.f, 0.f, 0.f);
      if (4 * lane < vcols) v4 = load4(st.v + tt * vcols, 4 * lane, p.v.f32);
      __syncwarp();  // every raw element of the warp's rows is read before any is overwritten
      finish(st, tt, q4, k4, g4, gc);
      if (4 * lane < vcols) *reinterpret_cast<float4*>(st.v + tt * vcols + 4 * lane) = v4;
    }
  };
  // A later group (a varlen sequence longer than tg): loaded directly into the current slot.
  auto stage_direct = [&](const ItemHead& it, const Staging& st, int64_t g0, int cnt) {
    const int64_t bat = varlen ? 0 : it.n;
    const int h = it.hv / p.group;
    if (warp >= cnt) return;
    const GateConsts gc = gate_constants(st.par + warp * (kD + 4));
#pragma unroll 1
    for (int tt = warp; tt < cnt; tt += warps) {
      const int64_t row = it.tok0 + g0 + tt;
      const float4 q4 = load4(p.q.data, bat * p.q.batch + row * p.q.token + h * p.q.head + 4 * lane, p.q.f32);
      const float4 k4 = load4(p.k.data, bat * p.k.batch + row * p.k.token + h * p.k.head + 4 * lane, p.k.f32);
      const float4 g4 = load4(p.g.data, bat * p.g.batch + row * p.g.token + it.hv * p.g.head + 4 * lane, p.g.f32);
      finish(st, tt, q4, k4, g4, gc);
      if (4 * lane < vcols)
        *reinterpret_cast<float4*>(st.v + tt * vcols + 4 * lane) =
            load4(p.v.data, bat * p.v.batch + row * p.v.token + it.hv * p.v.head + it.col0 + 4 * lane, p.v.f32);
      if (lane == 0) {
        st.b[tt] = beta_value(load_bits(p.beta, bat * p.beta.batch + row * p.beta.token + it.hv * p.beta.head), p, fm);
        int64_t ws = -1;
        if (p.index_kind == IndexKind::PerToken) {
          ws = load_index(p.indices, it.n * p.idx_seq_stride + (g0 + tt) * p.idx_tok_stride, p.indices_64);
          if (ws >= p.pool_slots) ws = -1;
        }
        st.slot[tt] = ws;
      }
    }
  };

  float f[F::NC][F::E];
  // The lane's fragment of the current state to pool slot (or final_state row) dst.
  auto store_state = [&](const ItemHead& it, int64_t dst, int col0) {
    PoolT* s = static_cast<PoolT*>(p.state_out) + dst * p.out_slot_stride + it.hv * kHeadElems;
#pragma unroll
    for (int c = 0; c < F::NC; ++c) *reinterpret_cast<uint4*>(s + F::offset(c, lane, col0)) = pack_vec<PoolT>(f[c]);
  };
  // The tokens g0 .. g0 + cnt - 1 of the current item, staged in st: the recurrence, out rows
  // and the kept states.
  auto run = [&](const ItemHead& it, const Staging& st, int64_t g0, int cnt) {
    const int col0 = it.col0 + warp * kWarpCols;
    const int64_t bat = varlen ? 0 : it.n;
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
      const int64_t row = it.tok0 + g0 + tt;
      const int64_t out_row = bat * p.out.batch + row * p.out.token + it.hv * p.out.head + col0;
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
      else if (g0 + tt == it.len - 1 && p.state_out != nullptr) dst = it.slot;
      if (dst >= 0) store_state(it, dst, col0);
    }
  };

  // The block's work items: the j-th is blockIdx.x + j * gridDim.x. Items j + 1 .. j + D - 1
  // have their copies in flight while item j is computed; item j + D is resolved at the top of
  // iteration j and its copies issued once its slots are free (after the barrier).
  const int64_t w0 = blockIdx.x;
#pragma unroll
  for (int i = 0; i < D; ++i) {
    issue(resolve_item(p, w0 + i * stride, items, warps, tid), i);
    cute::cp_async_fence();
  }
#pragma unroll 1
  for (int64_t j = 0;; ++j) {
    const Item next = resolve_item(p, w0 + (j + D) * stride, items, warps, tid);
    const Staging st = staging(j);
    __syncwarp();  // lane 0's copy of the header is visible to the warp
    const ItemHead it = *reinterpret_cast<const ItemHead*>(st.head + warp * kDecodeItemHeadBytes);
    if (!it.live) break;
    cute::cp_async_wait<D - 1>();  // this thread's copies of item j have landed
    const bool compute = !it.skip && it.len > 0;
    if (compute) finish_copied(it, st);
    if (!it.skip && p.state_in != nullptr && (it.len > 0 || p.state_out != nullptr)) {
      const uint4* sb = state_slot(j);
#pragma unroll
      for (int c = 0; c < F::NC; ++c) unpack_vec<PoolT>(sb[c * threads + tid], f[c]);
    } else {
#pragma unroll
      for (int c = 0; c < F::NC; ++c)
#pragma unroll
        for (int e = 0; e < F::E; ++e) f[c][e] = 0.f;
    }
    __syncthreads();  // item j's staging is finished; every warp is done with item j - 1's slot
    issue(next, j + D);
    cute::cp_async_fence();

    const int col0 = it.col0 + warp * kWarpCols;
    if (it.skip) {
      // Padded: zero rows of out, no state read or written (no rows when it has no tokens).
      const int64_t bat = varlen ? 0 : it.n;
      for (int64_t e = lane; e < it.len * kWarpCols; e += 32) {
        const int64_t t = e / kWarpCols;
        const int c = int(e % kWarpCols);
        store_f(const_cast<void*>(p.out.data),
                bat * p.out.batch + (it.tok0 + t) * p.out.token + it.hv * p.out.head + col0 + c, 0.f, p.out.f32);
      }
    } else if (it.len == 0) {
      // A sequence of no tokens (varlen, no pool) passes its start state through.
      if (p.state_out != nullptr) store_state(it, it.slot, col0);
    } else {
      int cnt = int(it.len < tg ? it.len : tg);
      run(it, st, 0, cnt);
#pragma unroll 1
      for (int64_t g0 = tg; g0 < it.len; g0 += tg) {
        cnt = int(it.len - g0 < tg ? it.len - g0 : tg);
        __syncthreads();  // the previous group's staging is no longer read
        stage_direct(it, st, g0, cnt);
        __syncthreads();
        run(it, st, g0, cnt);
      }
    }
  }
  cute::cp_async_wait<0>();  // no copy outlives the block
}

template <StateLayout L, typename PoolT>
cudaError_t launch_gate(GateMode gate, const KernelLaunch& k, uint64_t ctx, const DecodeParams& p, cudaStream_t stream) {
  return with_gate(gate, [&](auto g) { return launch_planned<decode_kernel<L, PoolT, decltype(g)::value>>(k, ctx, p, stream); });
}

}  // namespace

void launch_decode(const DecodeArgs& a, const ProblemShape& ps, DecodeKernel kernel, Stream stream) {
  const int device = a.q.device_id;
  DeviceGuard guard(device);
  uint64_t ctx = 0;
  const DeviceProps props = sm90_stream_props(device, stream, &ctx);
  const TensorView& state = a.initial_state.defined() ? a.initial_state : a.final_state;
  const bool bf16_pool = state.defined() && state.dtype == DType::BF16;
  const DecodePlan plan = make_decode_plan(ps, props, bf16_pool ? 2 : 4, a.state_layout, kernel);

  const DecodeParams p = decode_params(a, ps, plan);

  cudaError_t e;
  if (plan.kernel == DecodeKernel::Direct && plan.kfirst_rows)
    e = launch_kfirst_rows(bf16_pool, a.gate, plan, ctx, p, stream);
  else if (plan.kernel == DecodeKernel::Direct)
    e = launch_direct(a.state_layout, bf16_pool, a.gate, plan, ctx, p, stream);
  else if (a.state_layout == StateLayout::VFirst)
    e = bf16_pool ? launch_gate<StateLayout::VFirst, __nv_bfloat16>(a.gate, plan.launch, ctx, p, stream)
                  : launch_gate<StateLayout::VFirst, float>(a.gate, plan.launch, ctx, p, stream);
  else
    e = bf16_pool ? launch_gate<StateLayout::KFirst, __nv_bfloat16>(a.gate, plan.launch, ctx, p, stream)
                  : launch_gate<StateLayout::KFirst, float>(a.gate, plan.launch, ctx, p, stream);
  check_cuda(e, "decode kernel launch");
}

}  // namespace flash_kda::sm90
