// The sm_90a direct decode kernel: the same call as the persistent kernel (decode.cu, semantics
// in include/flash_kda/decode.h), one block per work item, and inside it every warp runs its own
// tile of the item's state, all 128 keys of some value rows (v-first [V, K]) or columns (k-first
// [K, V]), from its first load to its last store, with no block barrier (and no shared memory
// but the split form's, each lane its own words).
//
// Why this shape. The call moves the states' bytes and little else, so an SM must keep state
// reads in flight all the time (~32 KB at 4.25 TB/s and ~1 us of loaded latency). Staging the
// tokens once per block for all its warps makes every warp wait at a barrier for the one that
// staged them (profiled on the H200: half of the warps' stall cycles at the barrier, DRAM 58%
// busy at 1024 x 32 fp32). Here each warp loads the few input elements its lanes use (their
// keys of q, k, g and one element of v per lane), finishes them with warp shuffles (the L2
// norms over the lanes that hold different keys) while its state loads are in flight, and warps
// drift apart freely, so that some warp of the SM is always waiting on state bytes while others
// compute. Token t + 1's inputs are loaded (raw bits into registers) before token t runs.
// - Tiles (VFirstTile, KFirstTile below): a lane holds NR 16-byte vectors of E pool elements;
//   the keys it uses are NK consecutive ones; the sums over K it forms are NO partial row (or
//   column) sums, finished over the lanes that hold the other keys.
// - Per token (fp32 math): S <- diag(exp(a)) S; u = b (v - S^T k); S += k u^T; o = S^T q,
//   evaluated as o = S_dec^T q + (k . q) u so that both reductions run over the decayed state
//   in one pass. The 2 x NO partial sums (S^T k, S^T q) are one reduce-scatter over the lanes
//   holding other keys, after which lane pairs hold S^T k and S^T q of one row (column); one
//   exchange gives each both, and every lane gets each of its rows' (columns') u from the lane
//   that computed it.
// - Pool semantics as decode.cu: the start slot decides a skip (negative or >= P: zero rows of
//   out, no state access); [N, T] indices send each token's state to its own valid slot.
// Modes: state layout, pool dtype, gate mode, one token a sequence (kOneToken) and the tile are
// template parameters (36 kernels); input dtypes, index kind and the beta / norm flags are uniform
// run-time branches.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

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

/// The reduction geometry both tiles share: the lanes holding other keys of the same rows
/// (columns) differ in lane bits kLo .. kHi; after the reduce-scatter of NO sums the lane holds
/// sum number sum_index(lane), which kDup lanes hold alike (bits kLo .. kHi / NO / 2).
template <int NO_, int kLo_, int kHi_>
struct TileSums {
  static constexpr int NO = NO_, kLo = kLo_, kHi = kHi_;
  static constexpr int kSpread = kHi / NO;  // lane bit of the lowest sum-index bit
  static constexpr int kDup = kSpread / kLo;
  static_assert(NO >= 1 && NO <= kHi / kLo, "one sum per lane pair at most");
  /// Reduce-scatter levels after the first (the k / q split at bit kHi).
  static constexpr int kLevels = log2_int(kHi / kLo);
  /// Lane bits outside the reduction (which rows or columns of an instruction the lane holds).
  static constexpr int kKeep = (31 & ~(2 * kHi - 1)) | (kLo - 1);
  __device__ static int sum_index(int lane) { return (lane & (kHi - 1)) / kSpread; }
  /// The lane that ends with the sums of this lane's sum o (its k-side lane).
  __device__ static int holder(int o, int lane) { return (lane & kKeep) | (o * kSpread); }
  /// One of the kDup lanes holding a sum, k side (the one that stores out).
  __device__ static bool stores(int lane) { return (lane & kHi) == 0 && (lane / kLo) % kDup == 0; }
};

/// v-first [V, K]: a warp owns kRows value rows, all 128 keys of each. A lane holds keys
/// key0 .. key0 + E - 1 of NR rows (an fp32 lane keys 4 lane .. + 3 of the warp's 8 rows, one
/// 512-byte row per warp instruction; a bf16 lane keys 8 (lane % 16) .. + 7 of half of them, two
/// rows per instruction); its partial sums are one per vector (row).
template <typename PoolT, int kRows>
struct VFirstTile : TileSums<kRows / (32 / (kD * int(sizeof(PoolT)) / 16)), 1, kD * int(sizeof(PoolT)) / 32> {
  static constexpr int E = 16 / int(sizeof(PoolT));
  static constexpr int LPR = kD / E;      // lanes per 128-key row: 32 fp32, 16 bf16
  static constexpr int RPI = 32 / LPR;    // rows one warp instruction covers
  static constexpr int NR = kRows / RPI;  // vectors a lane
  static constexpr int NK = E;            // keys a lane uses
  __device__ static int key0(int lane) { return (lane % LPR) * E; }
  /// Element offset of vector c from the warp's first row's first element (first * kD).
  __device__ static int offset(int c, int lane) { return (c * RPI + lane / LPR) * kD + key0(lane); }
  __device__ static int64_t tile_base(int first) { return int64_t(first) * kD; }
  /// The lane's key (index into its NK) and partial sum (into its NO) of element e of vector c.
  __device__ static constexpr int key_of(int, int e) { return e; }
  __device__ static constexpr int sum_of(int c, int) { return c; }
  /// Warp-local value index of partial sum o of the lane.
  __device__ static int value_of(int o, int lane) { return o * RPI + lane / LPR; }
};

/// k-first [K, V]: a warp owns kCols value columns, all 128 key rows of them. A lane holds
/// columns E (lane % LPK) .. + E - 1 of NR consecutive keys, key0 = NR (lane / LPK) (an fp32
/// lane 4 columns of 8 keys of the warp's 8 columns, 16 rows of 32 bytes per warp instruction;
/// bf16 with 8 columns: 8 columns of 4 keys, 32 rows of 16 bytes; bf16 with 16 columns: 8 of 8
/// keys); its partial sums are one per column of its vectors.
template <typename PoolT, int kCols>
struct KFirstTile : TileSums<16 / int(sizeof(PoolT)), kCols * int(sizeof(PoolT)) / 16, 16> {
  static constexpr int E = 16 / int(sizeof(PoolT));
  static constexpr int LPK = kCols / E;   // lanes per key row of the tile
  static constexpr int NR = kD * LPK / 32;  // vectors (keys) a lane
  static constexpr int NK = NR;
  static_assert(LPK >= 1 && NR * E * 32 == kD * kCols, "the tile covers the warp's columns once");
  __device__ static int key0(int lane) { return (lane / LPK) * NR; }
  /// Element offset of vector c from the warp's first column of key 0.
  __device__ static int offset(int c, int lane) { return (key0(lane) + c) * kD + (lane % LPK) * E; }
  __device__ static int64_t tile_base(int first) { return first; }
  __device__ static constexpr int key_of(int c, int) { return c; }
  __device__ static constexpr int sum_of(int, int e) { return e; }
  __device__ static int value_of(int o, int lane) { return (lane % LPK) * E + o; }
};

template <StateLayout L, typename PoolT, int kTile>
using Tile = std::conditional_t<L == StateLayout::VFirst, VFirstTile<PoolT, kTile>, KFirstTile<PoolT, kTile>>;

/// Sum of x over the lanes that hold the other keys (lane bits F::kHi .. F::kLo).
template <class F>
__device__ __forceinline__ float key_sum(float x) {
#pragma unroll
  for (int off = F::kHi; off >= F::kLo; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

/// One token's inputs as this lane loaded them (its NK keys of q, k and g).
template <int NK>
struct TokenRaw {
  RawVec<NK> q, k, g;
  uint32_t v_bits;     // v at the lane's own row or column (u is computed there)
  uint32_t beta_bits;
  int64_t slot;        // PerToken: the pool slot its state goes to
};

/// One token finished for this lane: scale * q and k normalised, the decays of its NK keys, b,
/// k . (scale q) and its v.
template <int NK>
struct Token {
  float q[NK], k[NK], d[NK];
  float b, kq, v;
  int64_t slot;
};

/// The forms (a warp owns all 128 keys of its tile of kTile rows or columns):
/// - 8 a warp, held in fp32 across the tokens (fp32 pools; bf16 pools on few heads), token
///   t + 1's inputs loaded into registers while token t runs.
/// - bf16 pool, kTile = 16, kOneToken (fixed length T = 1, the packed form): 16 a warp, kept as the loaded
///   bf16 vectors and decayed and updated in fp32 as they are read (the state is rounded once,
///   at its store, as in the other forms), so that a lane's 64 elements fit in 32 registers: a
///   bf16 warp of 8 rows has half the bytes of an fp32 one in flight for the same latency and
///   instructions, which holds a bf16 pool at ~1.9x of the floor where fp32 sits at ~1.1x
///   (docs/performance.md, "Decode").
/// - bf16 pool, more tokens, kTile = 16 (the split form): 16 a warp in fp32, half of the lane's
///   vectors in registers and half in the warp's own shared memory (each lane its own 16-byte
///   words: no barrier), read twice and written once a token, so that a warp has 4 KB of state
///   in flight as the fp32 form does (ptxas spills 140-200 bytes a lane there, fewer than
///   without the next token's loads ahead).
template <StateLayout L, typename PoolT, GateMode Gate, bool kOneToken, int kTile>
__global__ void __launch_bounds__(128, direct_min_blocks(kOneToken, int(sizeof(PoolT)), L, false))
    direct_warp_kernel(const DecodeParams p) {
  constexpr bool kWide = sizeof(PoolT) == 2 && kTile == 2 * kDirectWarpTile;
  constexpr bool kPacked = kWide && kOneToken, kSplit = kWide && !kOneToken;
  static_assert(kTile == direct_warp_tile(int(sizeof(PoolT)), kWide), "the forms above");
  using F = Tile<L, PoolT, kTile>;
  constexpr int E = F::E, NR = F::NR, NK = F::NK, NO = F::NO;
  constexpr int NF = kPacked ? 0 : (kSplit ? NR / 2 : NR);  // vectors held in fp32 registers
  constexpr int64_t kHeadElems = int64_t(kD) * kD;
  const int warps = int(blockDim.x) / 32;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int cols = warps * kTile;
  const bool varlen = p.seq.cu_seqlens != nullptr;
  const int64_t items = p.seq.num_seqs * p.value_heads * p.slices;
  const ptx::FastMath fm;
  void* const out = const_cast<void*>(p.out.data);
  const int kb = F::key0(lane);
  const int v_own = F::value_of(F::sum_index(lane), lane);  // warp-local value index of the lane's sums
  // A programmatic dependent of the kernel before it on the stream (plan.h): any input may be
  // that kernel's output, so nothing is read before it completes; the block launch and the
  // setup above overlap its tail. The next kernel may then launch: it waits in the same way.
  ptx::wait_prior_grid();
  ptx::launch_dependents();

#pragma unroll 1
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    // The item: value indices col0 .. col0 + cols - 1 of value head hv of sequence n; this
    // warp's are first .. first + kTile - 1.
    const int slice = int(w % p.slices);
    const int64_t nh = w / p.slices;
    const int hv = int(nh % p.value_heads);
    const int64_t n = nh / p.value_heads;
    const int first = slice * cols + warp * kTile;
    const int64_t tok0 = varlen ? p.seq.start(n) : 0;
    const int64_t len = varlen ? p.seq.length(n) : p.seq.seqlen;
    const int64_t bat = varlen ? 0 : n;
    const int h = hv / p.group;
    auto load_token = [&](int64_t t) {
      TokenRaw<NK> x;
      const int64_t row = tok0 + t;
      x.q = load_vec<NK>(p.q.data, bat * p.q.batch + row * p.q.token + h * p.q.head + kb, p.q.f32);
      x.k = load_vec<NK>(p.k.data, bat * p.k.batch + row * p.k.token + h * p.k.head + kb, p.k.f32);
      x.g = load_vec<NK>(p.g.data, bat * p.g.batch + row * p.g.token + hv * p.g.head + kb, p.g.f32);
      const int64_t vi = bat * p.v.batch + row * p.v.token + hv * p.v.head + first + v_own;
      x.v_bits = load_bits(p.v, vi);
      x.beta_bits = load_bits(p.beta, bat * p.beta.batch + row * p.beta.token + hv * p.beta.head);
      x.slot = p.index_kind == IndexKind::PerToken
                   ? load_index(p.indices, n * p.idx_seq_stride + t * p.idx_tok_stride, p.indices_64)
                   : -1;
      return x;
    };
    // Token 0's inputs and the gate's parameters do not depend on the slot: their loads are in
    // flight while the slot index is read, so that a small batch waits for the index, then the
    // state, with token 0 finished in the meantime.
    TokenRaw<NK> next{};
    if (len > 0) next = load_token(0);
    const GateParamsRaw<Gate, NK> gate_raw(p, hv, kb);
    bool skip = false;
    const int64_t slot = start_slot(p, n, len, skip);

    // Every load of the lane's state vectors, at once (first waited for after token 0's inputs).
    uint4 raw[NR];
    const bool load = !skip && p.state_in != nullptr && (len > 0 || p.state_out != nullptr);
    const int64_t tile = hv * kHeadElems + F::tile_base(first);
    if (load) {
      const PoolT* s = static_cast<const PoolT*>(p.state_in) + slot * p.in_slot_stride + tile;
#pragma unroll
      for (int c = 0; c < NR; ++c) raw[c] = __ldcg(reinterpret_cast<const uint4*>(s + F::offset(c, lane)));
    } else {
#pragma unroll
      for (int c = 0; c < NR; ++c) raw[c] = make_uint4(0u, 0u, 0u, 0u);
    }

    if (skip) {  // padded: zero rows of out, no state read or written
      const int64_t base = bat * p.out.batch + hv * p.out.head + first;
      for (int64_t e = lane; e < len * kTile; e += 32)
        store_f(out, base + (tok0 + e / kTile) * p.out.token + int(e % kTile), 0.f, p.out.f32);
      continue;
    }

    // The gate's per-head constants and this lane's NK channels of dt_bias (loaded with token
    // 0's inputs).
    const GateHead<Gate, NK> gate(gate_raw.a_log, gate_raw.bias, p.dt_bias != nullptr, p.lower_bound, fm);

    auto finish_token = [&](const TokenRaw<NK>& x) {
      Token<NK> y;
      finish_vec<NK>(x.q, p.q.f32, y.q);
      finish_vec<NK>(x.k, p.k.f32, y.k);
      float gin[NK];
      finish_vec<NK>(x.g, p.g.f32, gin);
      float qs = p.scale, ks = 1.f;
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < NK; ++e) dot = fmaf(y.q[e], y.k[e], dot);
      if (p.l2norm) {
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int e = 0; e < NK; ++e) sq = fmaf(y.q[e], y.q[e], sq), sk = fmaf(y.k[e], y.k[e], sk);
        sq = key_sum<F>(sq);
        sk = key_sum<F>(sk);
        qs *= ptx::rsqrt(sq + float(math::kL2NormEps));
        ks = ptx::rsqrt(sk + float(math::kL2NormEps));
      }
      dot = key_sum<F>(dot);
#pragma unroll
      for (int e = 0; e < NK; ++e) {
        y.q[e] *= qs;
        y.k[e] *= ks;
        y.d[e] = gate.decay(gin[e], e, fm);
      }
      y.b = beta_value(x.beta_bits, p, fm);
      y.kq = dot * qs * ks;
      y.v = bits_value(x.v_bits, p.v.f32);
      y.slot = x.slot < p.pool_slots ? x.slot : -1;
      return y;
    };

    const int64_t out_base = bat * p.out.batch + hv * p.out.head + first;
    // The state in fp32: vectors 0 .. NF - 1 in registers, the split form's others in the
    // lane's shared-memory words (the packed form keeps `raw` instead).
    float f[NF > 0 ? NF : 1][E];
    float4* const spill = reinterpret_cast<float4*>(dynamic_smem()) + warp * 32 + lane;
    auto spill_word = [&](int c, int j) -> float4& { return spill[((c - NF) * (E / 4) + j) * warps * 32]; };
    auto load_spill = [&](int c, float (&x)[E]) {
#pragma unroll
      for (int j = 0; j < E / 4; ++j) {
        const float4 w = spill_word(c, j);
        x[4 * j] = w.x, x[4 * j + 1] = w.y, x[4 * j + 2] = w.z, x[4 * j + 3] = w.w;
      }
    };
    auto store_spill = [&](int c, const float (&x)[E]) {
#pragma unroll
      for (int j = 0; j < E / 4; ++j) spill_word(c, j) = make_float4(x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3]);
    };
    auto unpack = [&]() {
      if constexpr (!kPacked) {
#pragma unroll
        for (int c = 0; c < NR; ++c) {
          if (c < NF) {
            unpack_vec<PoolT>(raw[c], f[c < NF ? c : 0]);
          } else {
            float x[E];
            unpack_vec<PoolT>(raw[c], x);
            store_spill(c, x);
          }
        }
      }
    };
    // The lane's vectors of the current state to pool slot (or final_state row) dst.
    auto store_state = [&](int64_t dst) {
      PoolT* s = static_cast<PoolT*>(p.state_out) + dst * p.out_slot_stride + tile;
#pragma unroll
      for (int c = 0; c < NR; ++c) {
        if constexpr (kPacked) {
          ptx::st_global_v4(s + F::offset(c, lane), raw[c]);
        } else if (c < NF) {
          ptx::st_global_v4(s + F::offset(c, lane), pack_vec<PoolT>(f[c < NF ? c : 0]));
        } else {
          float x[E];
          load_spill(c, x);
          ptx::st_global_v4(s + F::offset(c, lane), pack_vec<PoolT>(x));
        }
      }
    };
    if (len == 0) {  // a sequence of no tokens (varlen, no pool) passes its start state through
      unpack();
      if (p.state_out != nullptr) store_state(slot);
      continue;
    }
    // One token on the registers: its out rows, and its state where it is kept.
    auto run = [&](const Token<NK>& y, int64_t t) {
      // S <- diag(exp(a)) S and the lane's partial sums of S^T k and S^T q, then summed at once
      // with the partner lane (bit kHi): lanes with the bit keep S^T q, the others S^T k (the
      // first level of a reduce-scatter of the 2 NO sums [S^T k, S^T q]).
      const bool upper = (lane & F::kHi) != 0;
      float ak[NO], aq[NO];
#pragma unroll
      for (int o = 0; o < NO; ++o) ak[o] = aq[o] = 0.f;
#pragma unroll
      for (int c = 0; c < NR; ++c) {
        const bool held = !kPacked && c < NF;  // else decayed here and again at the update
        float x[E];
        if constexpr (kPacked) unpack_vec<PoolT>(raw[c], x);
        else if (!held) load_spill(c, x);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const float d = y.d[F::key_of(c, e)];
          if (held) x[e] = f[c < NF ? c : 0][e] *= d;
          else x[e] *= d;
        }
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int key = F::key_of(c, e), o = F::sum_of(c, e);
          ak[o] = fmaf(x[e], y.k[key], ak[o]);
          aq[o] = fmaf(x[e], y.q[key], aq[o]);
        }
      }
      float acc[NO];
#pragma unroll
      for (int o = 0; o < NO; ++o)
        acc[o] = (upper ? aq[o] : ak[o]) + __shfl_xor_sync(0xffffffffu, upper ? ak[o] : aq[o], F::kHi);
      reduce_scatter<NO, F::kLevels, F::kHi / 2>(acc, lane);
      // Lanes with bit kHi hold S^T q of the lane's sum, their partners S^T k of the same.
      const float mine = acc[0], other = __shfl_xor_sync(0xffffffffu, mine, F::kHi);
      const float sk = upper ? other : mine, sq = upper ? mine : other;
      const float u = y.b * (y.v - sk);
      if (F::stores(lane)) store_f(out, out_base + (tok0 + t) * p.out.token + v_own, sq + y.kq * u, p.out.f32);
      // S += k u^T with each row's (column's) u from the lane that holds it (packed: the decayed
      // state recomputed from the loaded vectors, the same fp32 values, then rounded once).
      float us[NO];
#pragma unroll
      for (int o = 0; o < NO; ++o) us[o] = __shfl_sync(0xffffffffu, u, F::holder(o, lane));
#pragma unroll
      for (int c = 0; c < NR; ++c) {
        if (kPacked || c >= NF) {
          float x[E];
          if constexpr (kPacked) unpack_vec<PoolT>(raw[c], x);
          else load_spill(c, x);
#pragma unroll
          for (int e = 0; e < E; ++e) x[e] = fmaf(y.k[F::key_of(c, e)], us[F::sum_of(c, e)], x[e] * y.d[F::key_of(c, e)]);
          if constexpr (kPacked) raw[c] = pack_vec<PoolT>(x);
          else store_spill(c, x);
        } else {
#pragma unroll
          for (int e = 0; e < E; ++e) f[c][e] = fmaf(y.k[F::key_of(c, e)], us[F::sum_of(c, e)], f[c][e]);
        }
      }
      int64_t dst = -1;
      if (p.index_kind == IndexKind::PerToken) dst = y.slot;
      else if (t == len - 1 && p.state_out != nullptr) dst = slot;
      if (dst >= 0) store_state(dst);
    };

    // Token 0 is finished while the state loads are in flight; each later token's loads are
    // issued before the token ahead of it runs.
    Token<NK> cur = finish_token(next);
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

template <StateLayout L, typename PoolT, bool kOneToken, int kTile>
cudaError_t launch_gate(GateMode gate, const KernelLaunch& k, uint64_t ctx, const DecodeParams& p, cudaStream_t stream) {
  return with_gate(gate, [&](auto g) {
    return launch_planned<direct_warp_kernel<L, PoolT, decltype(g)::value, kOneToken, kTile>>(k, ctx, p, stream);
  });
}

template <StateLayout L, typename PoolT, int kTile>
cudaError_t launch_tokens(bool one_token, GateMode gate, const KernelLaunch& k, uint64_t ctx, const DecodeParams& p,
                          cudaStream_t stream) {
  return one_token ? launch_gate<L, PoolT, true, kTile>(gate, k, ctx, p, stream)
                   : launch_gate<L, PoolT, false, kTile>(gate, k, ctx, p, stream);
}

// The forms (the kernel's comment): fp32 8 a warp; bf16 8, or 16 (packed or split) as the
// plan says.
template <StateLayout L>
cudaError_t launch_pool(bool bf16_pool, GateMode gate, const DecodePlan& plan, uint64_t ctx, const DecodeParams& p,
                        cudaStream_t stream) {
  const KernelLaunch& k = plan.launch;
  if (!bf16_pool) return launch_tokens<L, float, kDirectWarpTile>(plan.one_token, gate, k, ctx, p, stream);
  return plan.wide ? launch_tokens<L, __nv_bfloat16, 2 * kDirectWarpTile>(plan.one_token, gate, k, ctx, p, stream)
                   : launch_tokens<L, __nv_bfloat16, kDirectWarpTile>(plan.one_token, gate, k, ctx, p, stream);
}

}  // namespace

cudaError_t launch_direct(StateLayout layout, bool bf16_pool, GateMode gate, const DecodePlan& plan, uint64_t ctx,
                          const DecodeParams& p, cudaStream_t stream) {
  return layout == StateLayout::VFirst ? launch_pool<StateLayout::VFirst>(bf16_pool, gate, plan, ctx, p, stream)
                                       : launch_pool<StateLayout::KFirst>(bf16_pool, gate, plan, ctx, p, stream);
}

}  // namespace flash_kda::sm90
