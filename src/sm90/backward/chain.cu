// The reverse state-gradient chain (the backward's only sequential part). Each value column of
// dS (the gradient of the state after the current chunk) evolves on its own, so one block per
// (sequence, value head, slice of kChainCols = 32 value columns) walks its chunks from the last
// to the first. Per chunk, from the chunk's record (records.h; chunk_algebra.cuh's math):
//
//   dU = M^T dO + kr dS      dR = Tinv^T dU      dS <- diag(eg) dS + qd^T dO - kd^T diag(b) dR
//
// and it stores dS before the step (the chunk-gradient kernel's input, k-first fp32). dS
// starts at d_final_state (zero without it); what is left after the first chunk is
// d_initial_state. An empty sequence passes d_final_state through.
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

__global__ void __launch_bounds__(kThreads) chain_kernel(BackwardParams p) {
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
  const auto state_at = [&](int mt, int nt, int r) {
    return slice + state_elem(p.state_k_first, c0 + 8 * nt + frag_c_col(lane, r), col0 + 16 * mt + frag_c_row(lane, r));
  };
  FragC ds[2][2];
  for_each_frag([&](int mt, int nt, int r) {
    ds[mt][nt].x[r] = p.d_final_state ? load_f(p.d_final_state, state_at(mt, nt, r), p.d_final_is_f32) : 0.f;
  });

  const SeqIndex::Span sp = p.seqs.span(n);
  const int64_t chunks = (sp.length + kC - 1) / kC;
  auto rows_of = [&](int64_t j) { return int(sp.length - j * kC < kC ? sp.length - j * kC : kC); };
  // Chunk j's record (from kd on), d out pair and dS rows in the workspace, each a fixed stride
  // per chunk from chunk 0's.
  const float* rec_src = p.records + (sp.first_slot * p.value_heads + hv) * int64_t(kRecordFloats) + RecordField::kd;
  const int64_t rec_stride = int64_t(p.value_heads) * kRecordFloats;
  float* const out0 = p.dstates + (sp.first_slot * p.value_heads + hv) * KV + col0;
  const int64_t out_stride = p.value_heads * KV;
  const DoSource do_src = do_source(p, sp, hv, col0);
  // Chunk j's record is in s.rec[stage], stage = (chunks - 1 - j) mod kStages; chunk j - 2's
  // goes to stage + 2 (mod 3), the buffer chunk j + 1 has left.
  int stage = 0;
  // Two chunks ahead: one cp.async group per chunk (an empty one past the first chunk, so that
  // every step waits for the same count), d out rows through `pend` (the next chunk's).
  DoPair pend;
  if (chunks > 0) {
    fetch_record(rec_src + (chunks - 1) * rec_stride, s.rec[0]);
    ptx::cp_async_commit();
    if (chunks > 1) fetch_record(rec_src + (chunks - 2) * rec_stride, s.rec[1]);
    ptx::cp_async_commit();
    store_do(s.dO[(chunks - 1) & 1], load_do(p, do_src, chunks - 1, rows_of(chunks - 1)), p.d_out_is_f32);
    if (chunks > 1) pend = load_do(p, do_src, chunks - 2, rows_of(chunks - 2));
  }
  for (int64_t j = chunks - 1; j >= 0; --j) {
    // dS of this chunk's end to the workspace, for chunk_grad: per store, four channel rows of
    // 32 contiguous bytes.
    float* out = out0 + j * out_stride;
    for_each_frag([&](int mt, int nt, int r) {
      out[(c0 + 8 * nt + frag_c_col(lane, r)) * kHeadDim + 16 * mt + frag_c_row(lane, r)] = ds[mt][nt].x[r];
    });
    ptx::cp_async_wait<1>();  // this chunk's group; the next one's may still be in flight
    __syncthreads();          // record j and d out rows j visible to all; the last step's reads done

    // Chunk j - 2's record and d out rows start loading.
    DoPair fresh;
    if (j >= 2) {
      fetch_record(rec_src + (j - 2) * rec_stride, s.rec[stage == 0 ? kStages - 1 : stage - 1]);
      fresh = load_do(p, do_src, j - 2, rows_of(j - 2));
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
      chain_dU_partial(w, part, ds, bkr, warp, dOhi, dOlo, rec + kM);
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
    {
      FragA ahi[2][2], alo[2][2];
      FragB bqd[2][2];
      chain_load_a_vec_T(w, ahi, dOhi);
      chain_load_a_vec_T(w, alo, dOlo);
      chain_load_b_rows(w, bqd, rec + kQd, c0);
      chain_mma_a(w, ds, ahi, alo, bqd);
      chain_load_b_rows(w, bkd, rec + kKd, c0);
    }
    __syncthreads();

    // 2. dU rows q and q + 8 of slice column v (the eight partials in a fixed order), the
    // column's 16 dU values through shuffles among its 8 lanes, dR_i = sum_{m >= i} Tinv_mi dU_m
    // (Tinv is zero above the diagonal) and -b_i dR_i.
    {
      const int q = lane & 7, v = 4 * warp + lane / 8;
      float lo[kWarps], hi[kWarps];
#pragma unroll
      for (int u = 0; u < kWarps; ++u) {
        lo[u] = s.part[u][part_off(q, v)];
        hi[u] = s.part[u][part_off(q + 8, v)];
      }
      const float ulo = ((lo[0] + lo[1]) + (lo[2] + lo[3])) + ((lo[4] + lo[5]) + (lo[6] + lo[7]));
      const float uhi = ((hi[0] + hi[1]) + (hi[2] + hi[3])) + ((hi[4] + hi[5]) + (hi[6] + hi[7]));
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
    if (j >= 1) store_do(s.dO[(j - 1) & 1], pend, p.d_out_is_f32);  // read from the next step on
    pend = fresh;
    stage = stage == kStages - 1 ? 0 : stage + 1;
  }
  ptx::cp_async_wait<0>();  // no copy outlives the block (the trailing groups are empty)

  if (p.d_initial_state)
    for_each_frag([&](int mt, int nt, int r) {
      store_f(p.d_initial_state, state_at(mt, nt, r), ds[mt][nt].x[r], p.d_initial_is_f32);
    });
}

}  // namespace

cudaError_t launch_chain(const BackwardParams& p, uint64_t context_key, cudaStream_t stream) {
  KernelLaunch k;
  k.grid_x = unsigned(p.seqs.num_seqs);
  k.grid_y = unsigned(p.value_heads * kSlices);
  k.block = kThreads;
  k.smem_bytes = k.smem_attr = kSmemBytes;
  return launch_planned<chain_kernel>(k, context_key, p, stream);
}

}  // namespace flash_kda::sm90::bwd
