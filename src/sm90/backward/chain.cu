// The reverse state-gradient chain (the backward's only sequential part). Each value column of
// dS (the gradient of the state after the current chunk) evolves on its own, so one block per
// (sequence, value head, slice of kChainCols = 32 value columns) walks its chunks from the last
// to the first. Per chunk, from the chunk's record (records.h; chunk_algebra.cuh's math):
//
//   dU = M^T dO + kr dS      dR = Tinv^T dU      dS <- diag(eg) dS + qd^T dO - kd^T diag(b) dR
//
// and it stores dS before the step (the chunk-gradient kernel's input, k-first fp32). dS
// starts at d_final_state (zero without it); what is left after the first chunk is
// d_initial_state. An empty sequence passes d_final_state through. Where few (sequence, value
// head) pairs would leave most SMs idle over a long walk, the walk runs in segments (ChainPass
// below; layout.h chain_segments says when).
//
// The products run on tensor cores (chain_products.cuh), each in 3xTF32, because dS sums
// hundreds of steps and must keep fp32's accuracy (plain tf32 would add an error of ~5e-4 of
// every term at every step). The slice's dS^T (32 x 128) lives in mma accumulators, warp w
// owning channels 16 w .. 16 w + 15 (2 x 2 tiles, 16 floats a thread). A step:
//   1. each warp's dU partial dS^T[:, its channels] kr^T[its channels, :] (32 x 16, A straight
//      from the accumulators) plus one of dO^T M's eight tiles, to shared memory; meanwhile
//      dS^T <- dS^T diag(eg) + dO^T qd, which does not wait for dU;                  barrier
//   2. dU = the eight partials added in a fixed order, dR = Tinv^T dU (SIMT: each thread two
//      rows of one value column, the column's 16 values through shuffles among 8 lanes), and
//      -diag(b) dR to shared memory;                                                 barrier
//   3. dS^T += (-diag(b) dR)^T kd.
// Records and d out rows load two chunks ahead (records by cp.async into a ring of three
// buffers; d out through registers), so that their DRAM latency (~1 us) stays under two steps.
// A step's dependent path is two chains of six mma (3xTF32 over two k-steps), the SIMT dR and
// three barriers, ~800 cycles; its ~650 instructions a warp, two warps a scheduler, take
// ~1300 issue cycles, the bound; and the step's 16 KB of dS stores, with the record, keep the
// DRAM near its bandwidth at 128 blocks. Every sum runs in a fixed order: the results are
// deterministic.
//
// 32 columns a block: a (sequence, head) gives four blocks, so 32 heads fill the SMs, and each
// block reads the whole record per step; 16 columns would double the record traffic through
// L2 and the per-block fixed work (record split, dR) for the same products, 64 would leave
// half the SMs idle at 32 heads. 8 warps, 16 channels each: 4 would double each warp's
// dependent mma chains and leave one warp a scheduler, 16 would double the loads of the dO and
// dR fragments (every warp reads all of them) and the partials to add. 114,880 B of shared
// memory and 128 registers: two blocks an SM when there are more blocks than SMs.
#include "sm90/backward/chain_products.cuh"
#include "sm90/backward/kernels.h"
#include "sm90/backward/layout.h"
#include "sm90/backward/records.h"
#include "sm90/backward/state_access.cuh"
#include "sm90/common/bf16.cuh"
#include "sm90/common/launch_config.h"
#include "sm90/common/ptx.cuh"
#include "sm90/forward/kernels.h"
#include "sm90/forward/params.h"
#include "sm90/forward/plan.h"

namespace flash_kda::sm90::bwd {
namespace {

constexpr int kSlices = kHeadDim / kChainCols;  // blocks per (sequence, value head)
static_assert(kSlices == kChainSlices, "validate_backward bounds HV by layout.h's kChainSlices");
constexpr int kThreads = 256;                   // 8 warps
constexpr int kWarps = kThreads / 32;
static_assert(kWarps * 16 == kHeadDim, "a warp owns 16 channels");
static_assert(kChainCols == 4 * kWarps && kThreads == kC * kChainCols / 2, "thread mappings below");
constexpr int kStages = 3;  // record buffers: the current chunk and two ahead
static_assert(kStages == 3, "the ring steps below: two ahead of stage s is stage s - 1");

// The chain reads the record from kd on, but A: kd, qd, kr (contiguous, [16][K] each) go to
// rows of stride kChainLd, then eg, then M, Tinv and b (contiguous) unchanged.
constexpr int kRowFloats = 3 * kC * kHeadDim;
constexpr int kTailFloats = kHeadDim + (kRecordFloats - RecordField::M);  // eg; M, Tinv, b
static_assert(RecordField::qd == RecordField::kd + kC * kHeadDim && RecordField::kr == RecordField::qd + kC * kHeadDim &&
                  RecordField::eg == RecordField::kr + kC * kHeadDim && RecordField::A == RecordField::eg + kHeadDim &&
                  RecordField::M == RecordField::A + kC * kC,
              "kd, qd, kr contiguous, then eg, A, M ..");
static_assert(RecordField::kd % 4 == 0 && kChainLd % 4 == 0 && kTailFloats % 4 == 0 && kHeadDim % 4 == 0,
              "16-byte copies");
constexpr int kRecSmem = 3 * kC * kChainLd + kTailFloats;
static_assert(kRecSmem % 4 == 0, "16-byte aligned buffers");

// Offsets of the record's fields in the shared copy.
constexpr int kKd = 0;
constexpr int kQd = kC * kChainLd;
constexpr int kKr = 2 * kC * kChainLd;
constexpr int kEg = 3 * kC * kChainLd;
constexpr int kM = kEg + kHeadDim;
constexpr int kTinv = kM + RecordField::Tinv - RecordField::M;
constexpr int kB = kM + RecordField::b - RecordField::M;

// The warps' dU partials, [kWarps][16][32] (token rows i, value columns v), element (i, v) at
// column v ^ part_swizzle(i): the warps' fragment stores (i = 2t or 2t + 1, v = g + const) and
// the reduction's loads (i = q, v = 4 w + cc) meet each bank once.
__device__ __forceinline__ int part_off(int i, int v) { return i * kChainCols + (v ^ ((i & 7) << 2)); }

struct Smem {
  float rec[kStages][kRecSmem];
  float dO[2][2][kVecTile];                // the current and the next chunk's d out rows: head, tail (vec_frag_off)
  float part[kWarps][kC * kChainCols];     // the warps' dU partials (part_off)
  float nbdR[2][kVecTile];                 // -diag(b) dR: head, tail (vec_frag_off)
};
static_assert(offsetof(Smem, dO) % 16 == 0 && offsetof(Smem, nbdR) % 16 == 0 && kVecTile % 4 == 0,
              "fragments as 16-byte loads");
constexpr int kSmemBytes = int(sizeof(Smem));
static_assert(2 * (kSmemBytes + 1024) <= 228 * 1024, "two blocks an SM (1 KB reserved a block)");

// Starts the copy of a record (src at its kd) into rec (the caller closes the group). Thread
// tid copies the pieces at floats e = 4 tid + 1024 k from kd: k = 0..5 cover kd, qd, kr (1024
// floats are 8 rows, so piece k sits 8 (tid / 32 + 8 k) floats further in rows of stride
// kChainLd); then piece e of the tail, eg or (past A) M, Tinv, b. The destinations depend on
// tid alone.
constexpr int kPiecesPerRound = 4 * kThreads;
static_assert(kRowFloats % kPiecesPerRound == 0 && kPiecesPerRound == 8 * kHeadDim, "whole rounds of 8 rows");
static_assert(kTailFloats <= kPiecesPerRound, "one round of tail");
static_assert(kChainLd - kHeadDim == 8, "8 floats of padding a row");
__device__ __forceinline__ void fetch_record(const float* src, float* rec) {
  const int e = 4 * int(threadIdx.x), d = e + 8 * int(threadIdx.x / 32);
#pragma unroll
  for (int k = 0; k < kRowFloats / kPiecesPerRound; ++k)
    ptx::cp_async_16(rec + d + k * 8 * kChainLd, src + e + k * kPiecesPerRound);
  if (e < kTailFloats) {
    const int from = RecordField::eg - RecordField::kd + (e < kHeadDim ? e : e + (RecordField::M - RecordField::A));
    ptx::cp_async_16(rec + kEg + e, src + from);
  }
}

// A thread's two d out elements of a chunk: row i = tid / 16, columns 2 (tid % 16) and + 1 of
// the slice; zero past the chunk's `rows` tokens. The byte offset of the pair in chunk j is
// off0 + j * chunk_stride (RowLayout::offset is linear in the token, and the sequence's
// layout_seq is the same for all its tokens). The pair stays in its loaded bits (two fp32, or
// one bf16 pair in bits.x) until store_do: converted at the load, the conversion would wait
// there for the load, two chunks early (ncu: a quarter of the chain's stall samples).
struct DoPair {
  uint2 bits = make_uint2(0u, 0u);
};
struct DoSource {
  int64_t off0, chunk_stride;
};
__device__ __forceinline__ DoSource do_source(const BackwardParams& p, const SeqIndex::Span& sp, int hv, int col0) {
  const int i = threadIdx.x / 16, v = col0 + 2 * (threadIdx.x % 16);
  const int64_t ln = layout_seq(sp.begin, p.seqs.seqlen, p.seqs.cu_seqlens != nullptr);
  return {p.d_out_rows.offset(ln, sp.begin + i, hv) + int64_t(v) * (p.d_out_is_f32 ? 4 : 2),
          kC * p.d_out_rows.token_stride};
}
__device__ __forceinline__ DoPair load_do(const BackwardParams& p, const DoSource& src, int64_t j, int rows) {
  DoPair d;
  if (int(threadIdx.x / 16) < rows) {
    const char* at = static_cast<const char*>(p.d_out) + src.off0 + j * src.chunk_stride;
    if (p.d_out_is_f32)
      d.bits = *reinterpret_cast<const uint2*>(at);
    else
      d.bits.x = *reinterpret_cast<const uint32_t*>(at);
  }
  return d;
}
// Stores the pair as fp32, split into tf32 head and tail (chain_products.cuh), into
// dO[2][kVecTile].
__device__ __forceinline__ void store_do(float (*dO)[kVecTile], const DoPair& d, bool is_f32) {
  const int i = threadIdx.x / 16, v = 2 * (threadIdx.x % 16);
  const float2 f = is_f32 ? make_float2(__uint_as_float(d.bits.x), __uint_as_float(d.bits.y)) : unpack_bf16(d.bits.x);
  tf32_split(f.x, dO[0][vec_frag_off(i, v)], dO[1][vec_frag_off(i, v)]);
  tf32_split(f.y, dO[0][vec_frag_off(i, v + 1)], dO[1][vec_frag_off(i, v + 1)]);
}

// Calls f(mt, nt, r) for each element of a warp's 2 x 2 accumulator tiles over its 16 channels
// and the slice's 32 columns (dS^T, or a dU partial): tile [mt][nt].x[r] holds the warp's
// channel 8 nt + frag_c_col(lane, r) and slice column 16 mt + frag_c_row(lane, r).
template <class F>
__device__ __forceinline__ void for_each_frag(F&& f) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) f(mt, nt, r);
}

// What a chain block computes (one template instantiation each). Whole: dS over the whole
// sequence from d_final_state, storing dS before every step, then d_initial_state. With
// segments (layout.h chain_segments), Finish does the same over one segment, from the scan's
// dS at the segment's end (chain_ends), and only segment 0 writes d_initial_state. Without d
// out, each step is the linear map dS <- A_c dS, A_c = diag(eg) - kd^T diag(b) Tinv^T kr, and d
// out adds B_c(dO_c) to it; a segment's dS at its start is then T_s dS_end + I_s with the transition map
// T_s = A_lo .. A_hi-1 and the input map I_s (dS_end = 0). TransitionMap walks the segment from
// the identity (the slice's 32 columns of it) without d out, InputMap from zero with it; both
// store no dS and leave their end, transposed, in chain_maps, where the forward's segment scan
// reads X_{j+1} = X_j P_j + Q_j with X = dS^T, P = T^T, Q = I^T.
enum class ChainPass { Whole, Finish, TransitionMap, InputMap };

template <ChainPass kPass>
__global__ void __launch_bounds__(kThreads) chain_kernel(BackwardParams p) {
  constexpr bool kSegment = kPass != ChainPass::Whole;
  constexpr bool kMap = kPass == ChainPass::TransitionMap || kPass == ChainPass::InputMap;
  constexpr bool kDo = kPass != ChainPass::TransitionMap;  // d out enters the steps
  Smem& s = *reinterpret_cast<Smem*>(dynamic_smem());
  const int64_t n = blockIdx.x;
  const int hv = blockIdx.y / kSlices;
  const int col0 = (blockIdx.y % kSlices) * kChainCols;  // the slice's first value column
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c0 = 16 * warp;  // the warp's first channel
  const int64_t KV = int64_t(kHeadDim) * kHeadDim;
  const int64_t slice = (n * p.value_heads + hv) * KV;
  const DeviceWarp w;

  // ds[mt][nt].x[r] is dS at channel c = c0 + 8 nt + frag_c_col(lane, r), slice column
  // v = 16 mt + frag_c_row(lane, r): element state_at(mt, nt, r) of a state in the call's layout.
  const auto chan = [&](int nt, int r) { return c0 + 8 * nt + frag_c_col(lane, r); };
  const auto col = [&](int mt, int r) { return col0 + 16 * mt + frag_c_row(lane, r); };
  const auto state_at = [&](int mt, int nt, int r) { return slice + state_elem(p.state_k_first, chan(nt, r), col(mt, r)); };
  // Element (channel, column) of a transposed [V][K] state of the scan's buffers.
  const auto scan_at = [&](int mt, int nt, int r) { return state_elem(false, chan(nt, r), col(mt, r)); };
  // The start state. Whole reads it before the sequence's span, as it needs no span for it:
  // with the span first, ptxas schedules the step loop 12 instructions longer.
  FragC ds[2][2];
  const auto load_start = [&](int64_t scan_index) {
    for_each_frag([&](int mt, int nt, int r) {
      float x = 0.f;
      if constexpr (kPass == ChainPass::TransitionMap) {
        x = chan(nt, r) == col(mt, r) ? 1.f : 0.f;
      } else if constexpr (kPass == ChainPass::Finish) {
        x = p.chain_ends[seg_state_offset(n, scan_index, hv, p.chain_max_segs, p.value_heads) + scan_at(mt, nt, r)];
      } else if constexpr (kPass == ChainPass::Whole) {
        if (p.d_final_state) x = load_f(p.d_final_state, state_at(mt, nt, r), p.d_final_is_f32);
      }
      ds[mt][nt].x[r] = x;
    });
  };
  if constexpr (!kSegment) load_start(0);

  const SeqIndex::Span sp = p.seqs.span(n);
  const int64_t chunks = (sp.length + kC - 1) / kC;
  // The chunk range [lo, hi) and, with segments, the segment's index on the scan's axis (the
  // scan walks the segments from the sequence's end: index S - 1 - s for segment s).
  const int64_t segs = kSegment ? (chunks + p.chain_seg_len - 1) / p.chain_seg_len : 1;
  const int64_t seg = kMap ? int64_t(blockIdx.z) + 1 : int64_t(blockIdx.z);  // maps: segments 1 .. S - 1
  if (kSegment && seg >= segs) return;
  const int64_t lo = kSegment ? seg * p.chain_seg_len : 0;
  const int64_t hi = kSegment && lo + p.chain_seg_len < chunks ? lo + p.chain_seg_len : chunks;
  const int64_t scan_index = segs - 1 - seg;
  if constexpr (kSegment) load_start(scan_index);

  auto rows_of = [&](int64_t j) { return int(sp.length - j * kC < kC ? sp.length - j * kC : kC); };
  // Chunk j's record (from kd on), d out pair and dS rows in the workspace, each a fixed stride
  // per chunk from chunk 0's.
  const float* rec_src = p.records + (sp.first_slot * p.value_heads + hv) * int64_t(kRecordFloats) + RecordField::kd;
  const int64_t rec_stride = int64_t(p.value_heads) * kRecordFloats;
  float* const out0 = p.dstates + (sp.first_slot * p.value_heads + hv) * KV + col0;
  const int64_t out_stride = p.value_heads * KV;
  const DoSource do_src = do_source(p, sp, hv, col0);
  // Chunk j's record is in s.rec[stage], stage = (hi - 1 - j) mod kStages; chunk j - 2's
  // goes to stage + 2 (mod 3), the buffer chunk j + 1 has left.
  int stage = 0;
  // Two chunks ahead: one cp.async group per chunk (an empty one past the first chunk, so that
  // every step waits for the same count), d out rows through `pend` (the next chunk's).
  DoPair pend;
  if (hi > lo) {
    fetch_record(rec_src + (hi - 1) * rec_stride, s.rec[0]);
    ptx::cp_async_commit();
    if (hi - 1 > lo) fetch_record(rec_src + (hi - 2) * rec_stride, s.rec[1]);
    ptx::cp_async_commit();
    if constexpr (kDo) {
      store_do(s.dO[(hi - 1) & 1], load_do(p, do_src, hi - 1, rows_of(hi - 1)), p.d_out_is_f32);
      if (hi - 1 > lo) pend = load_do(p, do_src, hi - 2, rows_of(hi - 2));
    }
  }
  for (int64_t j = hi - 1; j >= lo; --j) {
    // dS of this chunk's end to the workspace, for chunk_grad: per store, four channel rows of
    // 32 contiguous bytes.
    if constexpr (!kMap) {
      float* out = out0 + j * out_stride;
      for_each_frag([&](int mt, int nt, int r) {
        out[(c0 + 8 * nt + frag_c_col(lane, r)) * kHeadDim + 16 * mt + frag_c_row(lane, r)] = ds[mt][nt].x[r];
      });
    }
    ptx::cp_async_wait<1>();  // this chunk's group; the next one's may still be in flight
    __syncthreads();          // record j and d out rows j visible to all; the last step's reads done

    // Chunk j - 2's record and d out rows start loading.
    DoPair fresh;
    if (j - 2 >= lo) {
      fetch_record(rec_src + (j - 2) * rec_stride, s.rec[stage == 0 ? kStages - 1 : stage - 1]);
      if constexpr (kDo) fresh = load_do(p, do_src, j - 2, rows_of(j - 2));
    }
    ptx::cp_async_commit();
    const float* rec = s.rec[stage];
    const float* dOhi = s.dO[j & 1][0];
    const float* dOlo = s.dO[j & 1][1];

    // 1. The warp's dU partial, from dS before the update.
    {
      FragB bkr[2][2];
      chain_load_b_kr(w, bkr, rec + kKr, c0);
      FragC part[2][2];
      if constexpr (kDo)
        chain_dU_partial(w, part, ds, bkr, warp, dOhi, dOlo, rec + kM);
      else
        chain_state_kr(w, part, ds, bkr);
      for_each_frag([&](int mt, int nt, int r) {
        s.part[warp][part_off(8 * nt + frag_c_col(lane, r), 16 * mt + frag_c_row(lane, r))] = part[mt][nt].x[r];
      });
    }
    // dS^T <- dS^T diag(eg) + dO^T qd, while the other warps finish their partials.
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float e = rec[kEg + c0 + 8 * nt + frag_c_col(lane, r)];
        ds[0][nt].x[r] *= e;
        ds[1][nt].x[r] *= e;
      }
    FragB bkd[2][2];
    if constexpr (kDo) {
      FragA ahi[2][2], alo[2][2];
      FragB bqd[2][2];
      chain_load_a_vec_T(w, ahi, dOhi);
      chain_load_a_vec_T(w, alo, dOlo);
      chain_load_b_rows(w, bqd, rec + kQd, c0);
      chain_mma_a(w, ds, ahi, alo, bqd);
    }
    chain_load_b_rows(w, bkd, rec + kKd, c0);
    __syncthreads();

    // 2. dU rows q and q + 8 of slice column v (the eight partials in a fixed order), the
    // column's 16 dU values through shuffles among its 8 lanes, dR_i = sum_{m >= i} Tinv_mi dU_m
    // (Tinv is zero above the diagonal) and -b_i dR_i.
    {
      const int q = lane & 7, v = 4 * warp + lane / 8;
      float lo_p[kWarps], hi_p[kWarps];
#pragma unroll
      for (int u = 0; u < kWarps; ++u) {
        lo_p[u] = s.part[u][part_off(q, v)];
        hi_p[u] = s.part[u][part_off(q + 8, v)];
      }
      const float ulo = ((lo_p[0] + lo_p[1]) + (lo_p[2] + lo_p[3])) + ((lo_p[4] + lo_p[5]) + (lo_p[6] + lo_p[7]));
      const float uhi = ((hi_p[0] + hi_p[1]) + (hi_p[2] + hi_p[3])) + ((hi_p[4] + hi_p[5]) + (hi_p[6] + hi_p[7]));
      float rlo[2] = {0.f, 0.f}, rhi[2] = {0.f, 0.f};
#pragma unroll
      for (int m = 0; m < 8; ++m) {
        const float xl = __shfl_sync(0xffffffffu, ulo, (lane & 24) | m);
        const float xh = __shfl_sync(0xffffffffu, uhi, (lane & 24) | m);
        rlo[m & 1] += rec[kTinv + m * kC + q] * xl;
        rlo[m & 1] += rec[kTinv + (m + 8) * kC + q] * xh;
        rhi[m & 1] += rec[kTinv + (m + 8) * kC + q + 8] * xh;
      }
      tf32_split(-rec[kB + q] * (rlo[0] + rlo[1]), s.nbdR[0][vec_frag_off(q, v)], s.nbdR[1][vec_frag_off(q, v)]);
      tf32_split(-rec[kB + q + 8] * (rhi[0] + rhi[1]), s.nbdR[0][vec_frag_off(q + 8, v)],
                 s.nbdR[1][vec_frag_off(q + 8, v)]);
    }
    __syncthreads();

    // 3. dS^T += (-diag(b) dR)^T kd.
    {
      FragA ahi[2][2], alo[2][2];
      chain_load_a_vec_T(w, ahi, s.nbdR[0]);
      chain_load_a_vec_T(w, alo, s.nbdR[1]);
      chain_mma_a(w, ds, ahi, alo, bkd);
    }
    if constexpr (kDo)
      if (j - 1 >= lo) store_do(s.dO[(j - 1) & 1], pend, p.d_out_is_f32);  // read from the next step on
    pend = fresh;
    stage = stage == kStages - 1 ? 0 : stage + 1;
  }
  ptx::cp_async_wait<0>();  // no copy outlives the block (the trailing groups are empty)

  if constexpr (kMap) {
    float* map = p.chain_maps + seg_map_offset(n, scan_index, hv, kPass == ChainPass::TransitionMap ? 0 : 1,
                                               p.chain_max_segs, p.value_heads);
    for_each_frag([&](int mt, int nt, int r) { map[scan_at(mt, nt, r)] = ds[mt][nt].x[r]; });
  } else {
    if (lo == 0 && p.d_initial_state)
      for_each_frag([&](int mt, int nt, int r) {
        store_f(p.d_initial_state, state_at(mt, nt, r), ds[mt][nt].x[r], p.d_initial_is_f32);
      });
  }
}

template <ChainPass kPass>
cudaError_t launch_pass(const BackwardParams& p, unsigned segments, uint64_t context_key, cudaStream_t stream) {
  KernelLaunch k;
  k.grid_x = unsigned(p.seqs.num_seqs);
  k.grid_y = unsigned(p.value_heads * kSlices);
  k.grid_z = segments;
  k.block = kThreads;
  k.smem_bytes = k.smem_attr = kSmemBytes;
  return launch_planned<chain_kernel<kPass>>(k, context_key, p, stream);
}

}  // namespace

cudaError_t launch_chain(const BackwardParams& p, uint64_t context_key, cudaStream_t stream) {
  if (p.chain_seg_len == 0) return launch_pass<ChainPass::Whole>(p, 1, context_key, stream);
  const unsigned S = unsigned(p.chain_max_segs);
  cudaError_t e = launch_pass<ChainPass::TransitionMap>(p, S - 1, context_key, stream);
  if (e == cudaSuccess) e = launch_pass<ChainPass::InputMap>(p, S - 1, context_key, stream);
  if (e != cudaSuccess) return e;
  ScanParams sp{};
  sp.seqs = p.seqs;
  sp.value_heads = p.value_heads;
  sp.seg_len = p.chain_seg_len;
  sp.max_segs = p.chain_max_segs;
  sp.seg_maps = p.chain_maps;
  sp.seg_states = p.chain_ends;
  sp.initial_state = p.d_final_state;
  sp.initial_is_f32 = p.d_final_is_f32;
  sp.state_k_first = p.state_k_first;
  e = launch_segment_scan(sp, segment_scan_launch(p.seqs.num_seqs, p.value_heads), context_key, stream);
  if (e != cudaSuccess) return e;
  return launch_pass<ChainPass::Finish>(p, S, context_key, stream);
}

}  // namespace flash_kda::sm90::bwd
