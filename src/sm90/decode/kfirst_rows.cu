// The sm_90a direct decode kernel's row-block form for k-first pools ([P, HV, K, V]): the same
// call as direct_warp.cu (semantics in include/flash_kda/decode.h), one block per work item, the
// item's state slice loaded straight into registers, but a block owns C value columns of one
// (sequence, value head) for all 128 keys and its KW warps split the keys.
//
// Why this shape. In a k-first state a key row is 128 contiguous value elements. direct_warp.cu
// gives a warp 8 (16) value columns of all 128 keys, so one warp load instruction reads 16 (32)
// pieces of 32 (16) bytes of rows 512 (256) bytes apart: four times the L2 line requests of the
// same bytes in the v-first form: that form holds k-first pools at 1.4-2.1x of the HBM floor
// where v-first sits at 1.04-1.2x (H200). Here 8 lanes cover C columns of one key row with 16-byte vectors,
// 128 contiguous bytes (fp32: C = 32, bf16: C = 64): each warp load instruction reads four whole
// 128-byte lines of four key rows. The price is that the sums over the keys (S^T k and S^T q of
// a column) span the block's warps: one exchange through shared memory a token.
// - Tile: lane l of warp w holds key rows key0 = w * KR + (l / 8) * NR .. + NR - 1 (KR = 128 /
//   KW keys a warp, NR = KR / 4 a lane) of columns (l % 8) * E .. + E - 1 (E elements a 16-byte
//   vector): NR vectors, and its q, k and g are NR consecutive elements (vector loads).
// - Per token (fp32 math), with raw q and k (the L2 norms are scale factors applied after the
//   sums, so that nothing waits for them): S <- diag(exp(a)) S and the lane's partial sums of
//   S^T k and S^T q over its NR keys for its E columns, reduce-scattered over the 4 lanes of the
//   warp holding other keys of the same columns (lane bits 16 and 8), so that each lane keeps
//   both sums of NU = E / 4 columns; with the warp's partial sums of |q|^2, |k|^2 and k . q they
//   go to shared memory, double-buffered by token parity so that one __syncthreads a token
//   suffices (a warp writing token t + 2's buffer has passed token t + 1's barrier, which every
//   warp reaches only after reading token t's). After the barrier every lane sums the KW warps'
//   partials of its NU columns and of the norms itself, and computes u = b (v - S^T k) and
//   o = S^T q + (k . q) u there (warp 0 stores o); every lane gets the u of its E columns from
//   the 4 lanes that computed them (shuffles) and adds k u^T.
// - The state's loads are all issued at the item's start, before token 0's inputs are waited
//   for; token t + 1's inputs are loaded (raw bits) before token t runs.
// - Pool semantics as direct_warp.cu: the start slot decides a skip (negative or >= P: zero rows
//   of out, no state access); [N, T] indices send each token's state to its own valid slot.
//   Every branch of the item loop is uniform over the block (the barrier's condition).
// Forms, all at KW = 4: fp32 pool (8 vectors = 32 floats a lane, 4 KB of state a warp), any T;
// bf16 pool with one token a sequence, packed (8 vectors kept as the loaded bf16 bits, 32
// registers, decayed and updated in fp32 as they are read and rounded once at the store, as
// direct_warp.cu's packed form); bf16 pool with more tokens, split (kSplit: the 8 vectors in
// fp32 across the tokens, 64 floats a lane, vectors 0 .. 3 in registers and 4 .. 7 in the lane's
// own 16-byte words of shared memory after the exchange buffers, the block's threads apart so
// that a warp's access is 512 contiguous bytes and no lane reads another's words: no barrier
// for them; read for the decay and partial sums and read again, decayed again and written back
// at the update, as direct_warp.cu's split form). The plan (plan.h's kfirst_rows_serves) gives
// the first two the row blocks always and the split form from 4 N HV >= the SM count, below
// which direct_warp.cu's warp columns spread few heads wider. Pool dtype, gate mode, one token
// (kOneToken) and KW are template parameters; input dtypes, index kind and the beta / norm flags
// are uniform run-time branches.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gate.h"
#include "sm90/common/bf16.cuh"
#include "sm90/common/dynamic_smem.cuh"
#include "sm90/common/launch_config.h"
#include "sm90/common/ptx.cuh"
#include "sm90/decode/direct.h"
#include "sm90/decode/fragment.cuh"
#include "sm90/decode/gate_dispatch.h"
#include "sm90/decode/params.h"
#include "sm90/decode/plan.h"
#include "sm90/decode/staging.cuh"
#include "sm90/decode/token.cuh"

namespace flash_kda::sm90 {
namespace {

using namespace decode_detail;

/// The row-block tile of a lane (the header comment): KW key warps, E pool elements a vector.
template <typename PoolT, int KW>
struct RowsTile {
  static constexpr int E = 16 / int(sizeof(PoolT));
  static constexpr int C = kfirst_rows_cols(int(sizeof(PoolT)));  // 8 lanes x E: one 128-byte line
  static constexpr int KR = kD / KW;  // keys of a warp
  static constexpr int NR = KR / 4;   // keys (vectors) of a lane
  static constexpr int NU = E / 4;    // columns whose u and o the lane computes
  static_assert(C == 8 * E && NR * 4 * KW == kD, "4 key rows of 8 lanes a warp instruction");
  __device__ static int key0(int warp, int lane) { return warp * KR + (lane / 8) * NR; }
  /// Block-local index of the lane's first column.
  __device__ static int col0(int lane) { return (lane % 8) * E; }
  /// Block-local column of the lane's sum i (< NU) after the reduce-scatter over lane bits 16
  /// and 8 of the interleaved (S^T k, S^T q) pairs of its E columns.
  __device__ static int sum_col(int i, int lane) { return col0(lane) + (lane / 8) * NU + i; }
  /// The lane holding the sums of the lane's column e.
  __device__ static int holder(int e, int lane) { return (e / NU) * 8 + lane % 8; }
};

/// One token's inputs as this lane loaded them: its NR keys of q, k and g, v at its NU columns.
template <int NR, int NU>
struct RowsTokenRaw {
  RawVec<NR> q, k, g;
  uint32_t v_bits[NU];
  uint32_t beta_bits;
  int64_t slot;  // PerToken: the pool slot its state goes to
};

/// One token finished for this lane: raw q and k of its keys, their decays, the warp's partial
/// sums of |q|^2, |k|^2 and k . q (over its KR keys), b and v.
template <int NR, int NU>
struct RowsToken {
  float q[NR], k[NR], d[NR];
  float qq, kk, qk;
  float b, v[NU];
  int64_t slot;
};

/// Sum of x over the 4 lanes of a warp that hold other keys of the same columns (bits 16, 8).
__device__ __forceinline__ float rows_key_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 16);
  return x + __shfl_xor_sync(0xffffffffu, x, 8);
}

template <typename PoolT, GateMode Gate, bool kOneToken, int KW>
__global__ void __launch_bounds__(KW * 32, direct_min_blocks(kOneToken, int(sizeof(PoolT)), StateLayout::KFirst, true) * 4 / KW)
    kfirst_rows_kernel(const DecodeParams p) {
  using F = RowsTile<PoolT, KW>;
  constexpr int E = F::E, C = F::C, NR = F::NR, NU = F::NU;
  constexpr bool kPacked = sizeof(PoolT) == 2 && kOneToken;  // the state kept as its loaded bits
  constexpr bool kSplit = sizeof(PoolT) == 2 && !kOneToken;   // half of the fp32 state in shared memory
  constexpr int NF = kSplit ? NR / 2 : NR;                    // vectors in fp32 registers (not packed)
  constexpr int64_t kHeadElems = int64_t(kD) * kD;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const bool varlen = p.seq.cu_seqlens != nullptr;
  const int64_t items = p.seq.num_seqs * p.value_heads * p.slices;
  const ptx::FastMath fm;
  void* const out = const_cast<void*>(p.out.data);
  const int kb = F::key0(warp, lane);
  // Shared memory: [2][C][KW] (S^T k, S^T q) partials, then [2][KW] (|q|^2, |k|^2, k . q, 0),
  // then (split form) every lane's words of its vectors NF .. NR - 1 (plan.h's
  // kfirst_rows_smem_bytes), the block's threads apart.
  float2* const part = reinterpret_cast<float2*>(dynamic_smem());
  float4* const norms = reinterpret_cast<float4*>(part + 2 * C * KW);
  int parity = 0;  // the buffer of the next token, block-uniform across items
  // A programmatic dependent of the kernel before it on the stream (plan.h), as direct_warp.cu:
  // nothing is read before that kernel completes; then the next kernel may launch.
  ptx::wait_prior_grid();
  ptx::launch_dependents();

#pragma unroll 1
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    // The item: block-local columns 0 .. C - 1 are first .. first + C - 1 of value head hv of
    // sequence n.
    const int slice = int(w % p.slices);
    const int64_t nh = w / p.slices;
    const int hv = int(nh % p.value_heads);
    const int64_t n = nh / p.value_heads;
    const int first = slice * C;
    const int64_t tok0 = varlen ? p.seq.start(n) : 0;
    const int64_t len = varlen ? p.seq.length(n) : p.seq.seqlen;
    const int64_t bat = varlen ? 0 : n;
    const int h = hv / p.group;
    auto load_token = [&](int64_t t) {
      RowsTokenRaw<NR, NU> x;
      const int64_t row = tok0 + t;
      x.q = load_vec<NR>(p.q.data, bat * p.q.batch + row * p.q.token + h * p.q.head + kb, p.q.f32);
      x.k = load_vec<NR>(p.k.data, bat * p.k.batch + row * p.k.token + h * p.k.head + kb, p.k.f32);
      x.g = load_vec<NR>(p.g.data, bat * p.g.batch + row * p.g.token + hv * p.g.head + kb, p.g.f32);
      const int64_t vi = bat * p.v.batch + row * p.v.token + hv * p.v.head + first;
#pragma unroll
      for (int i = 0; i < NU; ++i) x.v_bits[i] = load_bits(p.v, vi + F::sum_col(i, lane));
      x.beta_bits = load_bits(p.beta, bat * p.beta.batch + row * p.beta.token + hv * p.beta.head);
      x.slot = p.index_kind == IndexKind::PerToken
                   ? load_index(p.indices, n * p.idx_seq_stride + t * p.idx_tok_stride, p.indices_64)
                   : -1;
      return x;
    };
    // Token 0's inputs and the gate's parameters are in flight while the slot index is read.
    RowsTokenRaw<NR, NU> next{};
    if (len > 0) next = load_token(0);
    const GateParamsRaw<Gate, NR> gate_raw(p, hv, kb);
    bool skip = false;
    const int64_t slot = start_slot(p, n, len, skip);

    // Every load of the lane's state vectors, at once (first waited for after token 0's inputs).
    uint4 raw[NR];
    const bool load = !skip && p.state_in != nullptr && (len > 0 || p.state_out != nullptr);
    const int64_t tile = hv * kHeadElems + int64_t(kb) * kD + first + F::col0(lane);
    if (load) {
      const PoolT* s = static_cast<const PoolT*>(p.state_in) + slot * p.in_slot_stride + tile;
#pragma unroll
      for (int c = 0; c < NR; ++c) raw[c] = __ldcg(reinterpret_cast<const uint4*>(s + c * kD));
    } else {
#pragma unroll
      for (int c = 0; c < NR; ++c) raw[c] = make_uint4(0u, 0u, 0u, 0u);
    }

    if (skip) {  // padded: zero rows of out, no state read or written
      const int64_t base = bat * p.out.batch + hv * p.out.head + first;
      for (int64_t e = threadIdx.x; e < len * C; e += blockDim.x)
        store_f(out, base + (tok0 + e / C) * p.out.token + int(e % C), 0.f, p.out.f32);
      continue;
    }

    const GateHead<Gate, NR> gate(gate_raw.a_log, gate_raw.bias, p.dt_bias != nullptr, p.lower_bound, fm);
    auto finish_token = [&](const RowsTokenRaw<NR, NU>& x) {
      RowsToken<NR, NU> y;
      finish_vec<NR>(x.q, p.q.f32, y.q);
      finish_vec<NR>(x.k, p.k.f32, y.k);
      float gin[NR];
      finish_vec<NR>(x.g, p.g.f32, gin);
      float qq = 0.f, kk = 0.f, qk = 0.f;
#pragma unroll
      for (int c = 0; c < NR; ++c) {
        qk = fmaf(y.q[c], y.k[c], qk);
        if (p.l2norm) qq = fmaf(y.q[c], y.q[c], qq), kk = fmaf(y.k[c], y.k[c], kk);
        y.d[c] = gate.decay(gin[c], c, fm);
      }
      y.qk = rows_key_sum(qk);
      y.qq = p.l2norm ? rows_key_sum(qq) : 0.f;
      y.kk = p.l2norm ? rows_key_sum(kk) : 0.f;
      y.b = beta_value(x.beta_bits, p, fm);
#pragma unroll
      for (int i = 0; i < NU; ++i) y.v[i] = bits_value(x.v_bits[i], p.v.f32);
      y.slot = x.slot < p.pool_slots ? x.slot : -1;
      return y;
    };

    // The state in fp32: vectors 0 .. NF - 1 in registers, the split form's others in the lane's
    // shared-memory words (the packed form keeps `raw` instead).
    float f[kPacked ? 1 : NF][E];
    auto words = [&]() {
      return SplitState<PoolT, NR, NF>{
          reinterpret_cast<float4*>(dynamic_smem() + kfirst_rows_smem_bytes(KW, C, false)) + threadIdx.x, KW * 32};
    };
    auto unpack = [&]() {
      if constexpr (kSplit) {
        words().unpack(raw, f);
      } else if constexpr (!kPacked) {
#pragma unroll
        for (int c = 0; c < NR; ++c) unpack_vec<PoolT>(raw[c], f[c]);
      }
    };
    // The lane's vectors of the current state to pool slot (or final_state row) dst.
    auto store_state = [&](int64_t dst) {
      PoolT* s = static_cast<PoolT*>(p.state_out) + dst * p.out_slot_stride + tile;
#pragma unroll
      for (int c = 0; c < NR; ++c) {
        if constexpr (kPacked) ptx::st_global_v4(s + c * kD, raw[c]);
        else if constexpr (kSplit) ptx::st_global_v4(s + c * kD, words().pack(c, f));
        else ptx::st_global_v4(s + c * kD, pack_vec<PoolT>(f[c]));
      }
    };
    if (len == 0) {  // a sequence of no tokens (varlen, no pool) passes its start state through
      unpack();
      if (p.state_out != nullptr) store_state(slot);
      continue;
    }
    const int64_t out_base = bat * p.out.batch + hv * p.out.head + first;
    auto run = [&](const RowsToken<NR, NU>& y, int64_t t) {
      // S <- diag(exp(a)) S and the lane's partial sums (S^T k, S^T q) of its E columns,
      // interleaved so that the reduce-scatter leaves each lane both sums of NU columns.
      float acc[2 * E];
#pragma unroll
      for (int e = 0; e < 2 * E; ++e) acc[e] = 0.f;
#pragma unroll
      for (int c = 0; c < NR; ++c) {
        const bool held = !kPacked && c < NF;  // else decayed here and again at the update
        float x[E];
        if constexpr (kPacked) unpack_vec<PoolT>(raw[c], x);
        else if (!held) words().load(c, x);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          if (held) x[e] = f[c < NF ? c : 0][e] *= y.d[c];
          else x[e] *= y.d[c];
          acc[2 * e] = fmaf(x[e], y.k[c], acc[2 * e]);
          acc[2 * e + 1] = fmaf(x[e], y.q[c], acc[2 * e + 1]);
        }
      }
      reduce_scatter<2 * E, 2, 16>(acc, lane);
      float2* const buf = part + parity * C * KW;
#pragma unroll
      for (int i = 0; i < NU; ++i) buf[F::sum_col(i, lane) * KW + warp] = make_float2(acc[2 * i], acc[2 * i + 1]);
      if (lane == 0) norms[parity * KW + warp] = make_float4(y.qq, y.kk, y.qk, 0.f);
      __syncthreads();
      // Every lane: the KW warps' partials of the norms and of its NU columns' sums.
      float qq = 0.f, kk = 0.f, qk = 0.f;
#pragma unroll
      for (int j = 0; j < KW; ++j) {
        const float4 x = norms[parity * KW + j];
        qq += x.x, kk += x.y, qk += x.z;
      }
      float qs = p.scale, ks = 1.f;
      if (p.l2norm) {
        qs *= ptx::rsqrt(qq + float(math::kL2NormEps));
        ks = ptx::rsqrt(kk + float(math::kL2NormEps));
      }
      const float kq = qk * qs * ks;
      float u[NU];
#pragma unroll
      for (int i = 0; i < NU; ++i) {
        const float4* src = reinterpret_cast<const float4*>(buf + F::sum_col(i, lane) * KW);
        float sk = 0.f, sq = 0.f;
#pragma unroll
        for (int j = 0; j < KW / 2; ++j) {
          const float4 x = src[j];
          sk += x.x + x.z, sq += x.y + x.w;
        }
        sk *= ks, sq *= qs;
        u[i] = y.b * (y.v[i] - sk);
        if (warp == 0)
          store_f(out, out_base + (tok0 + t) * p.out.token + F::sum_col(i, lane), sq + kq * u[i], p.out.f32);
      }
      parity ^= 1;
      // S += k u^T: the u of the lane's E columns from the lanes that computed them.
      float us[E];
#pragma unroll
      for (int e = 0; e < E; ++e) us[e] = __shfl_sync(0xffffffffu, u[e % NU], F::holder(e, lane));
#pragma unroll
      for (int c = 0; c < NR; ++c) {
        const float kn = y.k[c] * ks;
        if (kPacked || c >= NF) {
          float x[E];
          if constexpr (kPacked) unpack_vec<PoolT>(raw[c], x);
          else words().load(c, x);
#pragma unroll
          for (int e = 0; e < E; ++e) x[e] = fmaf(kn, us[e], x[e] * y.d[c]);
          if constexpr (kPacked) raw[c] = pack_vec<PoolT>(x);
          else words().store(c, x);
        } else {
#pragma unroll
          for (int e = 0; e < E; ++e) f[c < NF ? c : 0][e] = fmaf(kn, us[e], f[c < NF ? c : 0][e]);
        }
      }
      int64_t dst = -1;
      if (p.index_kind == IndexKind::PerToken) dst = y.slot;
      else if (t == len - 1 && p.state_out != nullptr) dst = slot;
      if (dst >= 0) store_state(dst);
    };

    // Token 0 is finished while the state loads are in flight; each later token's loads are
    // issued before the token ahead of it runs.
    RowsToken<NR, NU> cur = finish_token(next);
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

template <typename PoolT, bool kOneToken, int KW>
cudaError_t rows_launch_gate(GateMode gate, const KernelLaunch& k, uint64_t ctx, const DecodeParams& p,
                             cudaStream_t stream) {
  return with_gate(gate, [&](auto g) {
    return launch_planned<kfirst_rows_kernel<PoolT, decltype(g)::value, kOneToken, KW>>(k, ctx, p, stream);
  });
}

}  // namespace

cudaError_t launch_kfirst_rows(bool bf16_pool, GateMode gate, const DecodePlan& plan, uint64_t ctx, const DecodeParams& p,
                               cudaStream_t stream) {
  const KernelLaunch& k = plan.launch;
  // The forms of the kernel's comment: fp32 any T; bf16 packed (one token) or split.
  constexpr int KW = kKFirstRowsKeyWarps;
  if (plan.warps != KW) return cudaErrorInvalidConfiguration;  // a plan of no instantiated form
  if (!bf16_pool)
    return plan.one_token ? rows_launch_gate<float, true, KW>(gate, k, ctx, p, stream)
                          : rows_launch_gate<float, false, KW>(gate, k, ctx, p, stream);
  if (plan.one_token) return rows_launch_gate<__nv_bfloat16, true, KW>(gate, k, ctx, p, stream);
  // The split form's words past the exchange buffers: a plan without them is none of its own.
  if (k.smem_bytes < kfirst_rows_smem_bytes(KW, kfirst_rows_cols(2), true)) return cudaErrorInvalidConfiguration;
  return rows_launch_gate<__nv_bfloat16, false, KW>(gate, k, ctx, p, stream);
}

}  // namespace flash_kda::sm90
