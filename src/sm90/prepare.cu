// Stage 1: the intra-chunk algebra (docs/kda-spec.md "Chunked form", the WY/UT transform).
// One 4-warp block per (chunk slot, value head); everything here is independent of the state,
// so all chunks of all heads run at once.
//
// The products run on tensor cores in tf32 (fla's Triton kernels do the same: tl.dot of fp32
// operands is tf32), with fp32 accumulation; the records are bf16 anyway. Phases:
//   1. the chunk's q, k and g rows are staged in shared memory by 16-byte cp.async, all in
//      flight at once (per-thread 2-byte global loads left the kernel latency-bound); then
//      thread c owns key channel c: gate, cumulative decay G, and the decayed operands
//      kd = k e^G, ki = k e^-G, qd = q e^G (raw q and k: not yet normalised). Each warp also
//      sums q_t^2 and k_t^2 over its 32 channels as the diagonals of q q^T and k k^T, bf16 mmas
//      over the staged rows (exact products, fp32 sums; diag_sumsq); warp 3 then adds the four
//      warps' partial sums into 1 / ||q_t|| and 1 / ||k_t||: the L2
//      norms fold into row/column scales of the 16x16 matrices and of the record's rows;
//   2. each thread takes its channel of kr = ki e^{G_C} / ||k|| into registers, and the Gram
//      products kd ki^T (-> L) and qd ki^T (-> M) run on all four warps, warp w taking matrix
//      w % 2 over channel half w / 2; warps 0-1 add warps 2-3's halves, normalise in registers
//      and store L and M over ki (dead by then);
//   3. (I + L)^-1 as a 2 x 2 blocked inverse of 8 x 8 blocks on the 32 lanes of warp 0;
//   4. W^T = kd^T Ak^T as a [channel x token] product, warp w owning channels 32w..32w+31;
//   5. the record (W, Qd, kr^T, Av, M, gC; params.h, in wgmma's tile layout) is assembled in
//      shared memory, W and Qd as rows padded to 272 bytes (see assembled()), and written with
//      coalesced 16-byte stores. v is not read here: the recurrence applies Av to it.
#include <cstddef>  // offsetof

#include <cuda_bf16.h>

#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/mma_sm80.hpp>

#include "common/gate.h"
#include "sm90/bf16.h"
#include "sm90/params.h"

namespace flash_kda::sm90 {
namespace {

using MmaTf32 = cute::SM80_16x8x8_F32TF32TF32F32_TN;
using MmaBf16 = cute::SM80_16x8x16_F32BF16BF16F32_TN;

constexpr int kThreads = kHeadDim;  // 4 warps
// Row stride of the [16][128] fp32 operand tiles: 132 = 4 (mod 32) makes the Gram products'
// fragment loads (lanes g = 0..7, t4 = 0..3 reading row g, column t4) hit 32 banks. Phase 4's
// transposed reads (row t4, channel pair 2g: banks 4 t4 + 2g, +1) are 2-way conflicted (~64
// wavefronts a record; a swizzle would fix them, the tile is read both ways).
constexpr int kPad = kHeadDim + 4;
constexpr int kSq = kChunk + 4;  // row stride of the 16x16 matrices read as B fragments
// Row stride of L and M: 24 = 24 (mod 32) makes the float2 stores from mma fragments
// conflict-free per half-warp, puts the inverse's two diagonal 8x8 blocks of L 8 banks apart
// (lanes 0-7 and 8-15 read them in the same instruction), and keeps rows 16-byte aligned for
// the blocked inverse's row reads.
constexpr int kLS = kChunk + 8;

// Shared memory, 27 KB (8 blocks fit an SM). The raw rows of phase 1 are staged over kd, qd and
// ki (every thread reads its columns before any of them is written); the 16x16 matrices take ki's
// place once the Grams and kr have read it (phase 2); the record is assembled over kd and qd
// once phase 4 is done (the 16x16 matrices, still read in phase 5, lie past them).
struct Smem {
  float kd[kChunk][kPad], qd[kChunk][kPad];
  union {
    float ki[kChunk][kPad];  // phases 1-2
    struct {
      float L[kChunk][kLS];  // strictly lower, normalised, times beta; its lower-right 8x8 block becomes that block's inverse
      float M[kChunk][kLS];  // lower incl. diagonal, normalised and scaled
      float Ak[kChunk][kSq];  // (I+L)^-1 diag(beta / ||k||): W = Ak k e^G
      float Av[kChunk][kSq];  // (I+L)^-1 diag(beta):         U = Av v - W S
    } m;
  };
  union {
    // Per warp, its 32 channels' sums of q_t^2 (row 0) and k_t^2 (row 1): phase 1 only.
    float sumsq[kThreads / 32][2][kChunk];
    // Warps 2-3's Gram halves (L, M) for warps 0-1, in mma fragment order [matrix][n-tile][lane]:
    // each lane reads back exactly what its twin lane wrote, 16-byte accesses, no conflicts.
    float4 part[2][2][32];
  };
  float beta[kChunk];
  // 1 / ||k_t|| and scale / ||q_t|| (eps inside the square root; q's norm is only ever used
  // times scale). 16-byte aligned: the per-channel loops read them 4 tokens a load.
  alignas(16) float rk[kChunk];
  alignas(16) float rq[kChunk];
};
static_assert(sizeof(Smem::m) <= sizeof(Smem::ki), "the 16x16 matrices fit over ki");
static_assert(sizeof(Smem) <= 27 * 1024, "8 blocks of 128 threads fit an SM (228 KB, 1 KB reserved a block)");

// Byte offset in shared memory, relative to the assembly area, of byte b of the chunk record.
// The record's first 48 rows (W, Qd, kr: bf16 [16][128] each, 256 bytes a row) are assembled
// 272 = 256 + 16 bytes apart: the W stores from mma fragments (tokens 2*t4, t4 = 0..3, of 8
// consecutive channel pairs per store, bf16x2) then start 4 * 2 = 8 banks apart (32 banks)
// instead of all on the same 8 banks (4-way conflicts at 256 bytes). Av, AvLo, M and gC follow them unpadded.
__host__ __device__ constexpr int assembled(int b) { return b + 16 * ((b < kRecAv ? b : kRecAv) / 256); }
constexpr int kAsmRow = kHeadDim + 8;  // bf16 elements per assembled W, Qd or kr row
static_assert(kRecW == 0 && kRecAv == 3 * kChunk * kHeadDim * 2 && kRecAv % 256 == 0,
              "W, Qd and kr are the record's first 256-byte rows");
static_assert(assembled(kRecQd) == kChunk * kAsmRow * 2 && assembled(kRecKr) == 2 * kChunk * kAsmRow * 2,
              "kAsmRow is the assembled row stride");
static_assert(assembled(kRecAv) % 16 == 0, "16-byte copy-out pieces stay aligned");
static_assert(assembled(kRecordBytes) <= offsetof(Smem, ki) && offsetof(Smem, kd) == 0,
              "the record is assembled over kd and qd, below the 16x16 matrices");

// The chunk's input rows as they are in global memory, q and k rows padded to 288 bytes:
// 72 words = 8 (mod 32) makes the norms' 8-byte fragment loads (lanes g = 0..3 of a half-warp
// at row g, words 2 t4, 2 t4 + 1: bank 8 g + 2 t4) hit 32 banks. 13-17 KB, over kd, qd and ki.
constexpr int kStageRow = kHeadDim + 16;
struct Staging {
  __nv_bfloat16 q[kChunk][kStageRow], k[kChunk][kStageRow];
  union {
    __nv_bfloat16 g16[kChunk][kHeadDim];
    float g32[kChunk][kHeadDim];  // g_is_f32
  };
};
static_assert(offsetof(Smem, qd) == sizeof(Smem::kd) && offsetof(Smem, ki) == 2 * sizeof(Smem::kd) &&
                  3 * sizeof(Smem::kd) >= sizeof(Staging),
              "the inputs are staged over kd, qd and ki");

// Issues the cp.async of the chunk's rows of one tensor (row of token tok: (tok * heads + head)
// * kRowBytes bytes from src), kRowBytes / 128 per thread. Rows past the sequence end are
// zero-filled (src-size 0, nothing read); their address is clamped to the last valid row all
// the same, so no address outside the tensor is ever formed.
template <int kRowBytes, int kDstRowBytes = kRowBytes>
__device__ __forceinline__ void stage_rows(void* dst, const void* src, int64_t t0, int valid, int64_t heads,
                                           int64_t head, int c) {
  using Copy = cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>;
  constexpr int kPieces = kRowBytes / 16;
  static_assert(kChunk * kPieces % kThreads == 0, "every thread issues the same number of copies");
#pragma unroll
  for (int n = 0; n < kChunk * kPieces / kThreads; ++n) {
    const int i = c + n * kThreads, t = i / kPieces, j = i % kPieces;
    const int64_t tok = t0 + (t < valid ? t : valid - 1);
    const char* s = static_cast<const char*>(src) + (tok * heads + head) * kRowBytes + j * 16;
    Copy::copy(*reinterpret_cast<const cute::uint128_t*>(s),
               static_cast<cute::uint128_t*>(dst)[t * (kDstRowBytes / 16) + j], t < valid);
  }
}

// fp32 -> tf32 for an mma operand, round to nearest, ties to even: cvt.rn.tf32.f32 is one
// instruction on sm_90 (the add-and-mask it replaces rounded ties away, 2 instructions; only
// exact ties differ). PTX does not promise that the low 13 bits of the result are zero, so its
// results only go where that cannot matter: into mma operands (which read tf32's 19 bits) or
// through a rounding to bf16 (which drops those bits anyway).
__device__ __forceinline__ float to_tf32(float x) {
  uint32_t y;
  asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(y) : "f"(x));
  return __uint_as_float(y);
}

// 2^x and 1/x as single MUFU instructions (flush-to-zero; rel. error ~2^-22, far below tf32 and
// bf16): the gate and the decay are computed in log2 units so that no exp needs a scaling FMUL.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t bits(float x) { return __float_as_uint(x); }

// Sums over channels c0 .. c0 + 31 of X[t][.]^2 for tokens g (.x) and g + 8 (.y), valid in the
// lanes with t4 == g / 2: the diagonal of X X^T on tensor cores (bf16 products are exact in
// fp32, fp32 accumulation). Which channel sits in which k-slot is immaterial to a sum over
// channels, so a lane loads 4 adjacent channels of rows g and g + 8 (one 8-byte load each) as
// its A fragment, and the same registers are the B fragments of n-tile 0 (tokens 0-7: rows g)
// and n-tile 1 (tokens 8-15: rows g + 8). Diagonal (i, i) is n-tile i / 8's row i, column
// i % 8: lane (g = i % 8, t4 = i % 8 / 2), accumulator i % 2 (+ 2 for n-tile 1).
__device__ __forceinline__ float2 diag_sumsq(const __nv_bfloat16 (*X)[kStageRow], int c0, int g, int t4) {
  float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    const uint2 lo = *reinterpret_cast<const uint2*>(&X[g][c0 + 16 * ks + 4 * t4]);
    const uint2 hi = *reinterpret_cast<const uint2*>(&X[g + 8][c0 + 16 * ks + 4 * t4]);
    MmaBf16::fma(d0[0], d0[1], d0[2], d0[3], lo.x, hi.x, lo.y, hi.y, lo.x, lo.y, d0[0], d0[1], d0[2], d0[3]);
    MmaBf16::fma(d1[0], d1[1], d1[2], d1[3], lo.x, hi.x, lo.y, hi.y, hi.x, hi.y, d1[0], d1[1], d1[2], d1[3]);
  }
  return g % 2 ? make_float2(d0[1], d1[3]) : make_float2(d0[0], d1[2]);
}

// acc[nt] = A[16 x 64] B[16 x 64]^T over channels c0 .. c0 + 63 for token n-tiles nt = 0, 1
// (A rows = tokens, B rows = tokens; both [token][channel] in shared memory).
__device__ __forceinline__ void gram_half(const float (*A)[kPad], const float (*B)[kPad], int c0, int g, int t4,
                                          float (&acc)[2][4]) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[nt][r] = 0.f;
#pragma unroll 4
  for (int kb = c0; kb < c0 + kHeadDim / 2; kb += 8) {
    const uint32_t a0 = bits(A[g][kb + t4]), a1 = bits(A[g + 8][kb + t4]);
    const uint32_t a2 = bits(A[g][kb + t4 + 4]), a3 = bits(A[g + 8][kb + t4 + 4]);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const uint32_t b0 = bits(B[8 * nt + g][kb + t4]), b1 = bits(B[8 * nt + g][kb + t4 + 4]);
      MmaTf32::fma(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3], a0, a1, a2, a3, b0, b1,
                   acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
    }
  }
}

// B fragments of a 16x16 matrix X used as B[k = token j][n = token i] = X[i][j], for the two
// k-steps ks and two n-tiles nt (k index t4 / t4+4 of a k-step of 8).
__device__ __forceinline__ void load_b16(const float (*X)[kSq], int g, int t4, uint32_t (&b)[2][2][2]) {
#pragma unroll
  for (int ks = 0; ks < 2; ++ks)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      b[ks][nt][0] = bits(X[8 * nt + g][8 * ks + t4]);
      b[ks][nt][1] = bits(X[8 * nt + g][8 * ks + t4 + 4]);
    }
}

// acc = X^T-side product for one m-tile of 16 channels starting at c0:
//   acc[nt] (channel x token) = T[token j][c0 + channel]^T B, T read from shared memory.
// The mma's row index is only a label: row g is channel c0 + 2g and row g + 8 channel
// c0 + 2g + 1, so a0/a1 (token t4) and a2/a3 (token t4 + 4) are each one 8-byte load of a
// channel pair, and acc[nt][e] / acc[nt][e + 2] are that pair for token 8 nt + 2 t4 + e (one
// bf16x2 store). Banks (row stride 4 mod 32): a half-warp (g = 0..3) reads words 4 t4 + 2g,
// +1: 2-way conflicted, 4 wavefronts per load, as the two 32-bit loads it replaces were.
__device__ __forceinline__ void tile_times(const float (*T)[kPad], int c0, int g, int t4,
                                           const uint32_t (&b)[2][2][2], float (&acc)[2][4]) {
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    const int j = 8 * ks + t4;
    const float2 lo = *reinterpret_cast<const float2*>(&T[j][c0 + 2 * g]);
    const float2 hi = *reinterpret_cast<const float2*>(&T[j + 4][c0 + 2 * g]);
    const uint32_t a0 = bits(lo.x), a1 = bits(lo.y), a2 = bits(hi.x), a3 = bits(hi.y);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
      MmaTf32::fma(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3], a0, a1, a2, a3, b[ks][nt][0], b[ks][nt][1],
                   acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
  }
}

// 8 blocks per SM (<= 64 registers, 8 x 27 KB of shared memory): each block runs its phases one
// after the other, with warps idle at the barriers, which only other resident blocks can fill
// (docs/perf-notes.md, stage 1's profile: barrier and latency stalls, not bandwidth alone).
__global__ void __launch_bounds__(kThreads, 8) prepare_kernel(const PrepareParams p) {
  __shared__ __align__(16) Smem sm;
  // The recurrence is this kernel's programmatic dependent launch (launch.cu): once every block
  // has started, i.e. in the last wave, its blocks may take the SMs this grid leaves idle and
  // load their initial states; they wait for this grid's completion before reading a record.
  cudaTriggerProgrammaticLaunchCompletion();

  const int c = threadIdx.x, lane = c % 32, warp = c / 32;
  // Without the bound ptxas treats c as possibly negative and every c / 2^n, c % 2^n costs a
  // sign fix-up (~280 SHF / LEA.HI in the kernel; the copy-out's index math was ~230
  // instructions for 7 stores).
  __builtin_assume(c >= 0 && c < kThreads);
  const int g = lane / 4, t4 = lane % 4;  // mma fragment coordinates
  const int hv = blockIdx.y, h = hv / p.group;
  const int64_t slot = p.slot_begin + blockIdx.x;
  const int64_t n = p.seqs.seq_of_slot(slot);
  const int64_t chunk = slot - p.seqs.first_slot(n);
  const int64_t seq_begin = p.seqs.start(n), seq_len = p.seqs.length(n);
  // An empty slot (no record is read for it), or bad cu_seqlens values (see SeqIndex::start).
  if (chunk < 0 || chunk * kChunk >= seq_len) return;
  const int64_t t0 = seq_begin + chunk * kChunk;
  const int valid = static_cast<int>(seq_len - chunk * kChunk < kChunk ? seq_len - chunk * kChunk : kChunk);

  // Phase 1. Tokens past the sequence end are zero (k = q = 0, b = 0, a = 0; their staged
  // rows are zero-filled, and may lie past the end of the tensors): they then leave U, S and the
  // chunk decay untouched, so the recurrence needs no masks.
  Staging& in = *reinterpret_cast<Staging*>(&sm.kd[0][0]);
  stage_rows<kHeadDim * 2, kStageRow * 2>(in.q, p.q, t0, valid, p.heads, h, c);
  stage_rows<kHeadDim * 2, kStageRow * 2>(in.k, p.k, t0, valid, p.heads, h, c);
  if (p.g_is_f32)
    stage_rows<kHeadDim * 4>(in.g32, p.g, t0, valid, p.value_heads, hv, c);
  else
    stage_rows<kHeadDim * 2>(in.g16, p.g, t0, valid, p.value_heads, hv, c);
  cute::cp_async_fence();
  // The remaining global loads go out while the copies are in flight.
  const float a_log = p.A_log[hv], bias = p.dt_bias[hv * kHeadDim + c];
  if (c < kChunk) {
    sm.beta[c] = c < valid ? math::beta_sigmoid_fast(load_f(p.beta, (t0 + c) * p.value_heads + hv, p.beta_is_f32))
                           : 0.f;
  }
  cute::cp_async_wait<0>();
  // Also what orders the reads below after the wait: CuTe's cp.async asm has no memory clobber.
  __syncthreads();

  float gC;
  {
    float q[kChunk], k[kChunk], gr[kChunk];
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      q[t] = __bfloat162float(in.q[t][c]);
      k[t] = __bfloat162float(in.k[t][c]);
    }
    {  // This warp's share of ||q_t||^2 and ||k_t||^2: its 32 channels.
      const float2 sq = diag_sumsq(in.q, 32 * warp, g, t4), sk = diag_sumsq(in.k, 32 * warp, g, t4);
      if (t4 == g / 2) {
        sm.sumsq[warp][0][g] = sq.x, sm.sumsq[warp][0][g + 8] = sq.y;
        sm.sumsq[warp][1][g] = sk.x, sm.sumsq[warp][1][g + 8] = sk.y;
      }
    }
    if (p.g_is_f32) {
#pragma unroll
      for (int t = 0; t < kChunk; ++t) gr[t] = in.g32[t][c];
    } else {
#pragma unroll
      for (int t = 0; t < kChunk; ++t) gr[t] = __bfloat162float(in.g16[t][c]);
    }
    __syncthreads();  // the staged rows are dead: kd and qd take their place; the sums are in
    if (warp == 3) {  // here, not in phase 2, so that kr can be taken at phase 2's start
      const int which = lane / kChunk, t = lane % kChunk;
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) s += sm.sumsq[w][which][t];
      // Rows past the sequence end are zero: rsqrt(eps), finite.
      const float r = rsqrtf(s + float(math::kL2NormEps));
      (which ? sm.rk : sm.rq)[t] = which ? r : p.scale * r;
    }
    // math::safe_gate_fast in log2 units: G2 = G log2(e), a2 = lower_bound log2(e) sigmoid(x),
    // sigmoid(x) = 1 / (1 + 2^(-exp(A_log) log2(e) x)). With the safe gate
    // G >= 16 * lower_bound >= -80, so 2^(+-G2) stays inside fp32's range; 2^y = inf for a
    // huge y gives rcp(inf) = 0, the sigmoid's limit.
    constexpr float kLog2e = 1.4426950408889634f;
    const float rate2 = -__expf(a_log) * kLog2e, x0 = bias * rate2, lb2 = p.lower_bound * kLog2e;
    float G2 = 0.f;
    auto step = [&](int t, bool live) {
      if (live) G2 = fmaf(lb2, rcp(1.f + ex2(fmaf(gr[t], rate2, x0))), G2);
      const float e = ex2(G2), ei = ex2(-G2);
      sm.kd[t][c] = to_tf32(k[t] * e);
      sm.ki[t][c] = to_tf32(k[t] * ei);
      sm.qd[t][c] = to_tf32(q[t] * e);
    };
    // A full chunk (all but a sequence's last; valid is uniform over the block) takes the loop
    // without the per-token predicate and selects.
    if (valid == kChunk) {
#pragma unroll
      for (int t = 0; t < kChunk; ++t) step(t, true);
    } else {
#pragma unroll
      for (int t = 0; t < kChunk; ++t) step(t, t < valid);
    }
    gC = ex2(G2);
  }
  __syncthreads();

  // Phase 2. This thread's channel of kr = ki e^{G_C} / ||k||, bf16 token pairs, kept in
  // registers for phase 5; then the Grams over channel halves (a chain of 8 mmas per
  // accumulator). ki is read by every warp here, so nothing may take its place before the
  // barrier: warps 2-3's halves go to `part`, which lies outside it.
  uint32_t kr[kChunk / 2];
#pragma unroll
  for (int t = 0; t < kChunk; t += 4) {
    const float4 r = *reinterpret_cast<const float4*>(&sm.rk[t]);
    kr[t / 2] = pack_bf16(sm.ki[t][c] * gC * r.x, sm.ki[t + 1][c] * gC * r.y);
    kr[t / 2 + 1] = pack_bf16(sm.ki[t + 2][c] * gC * r.z, sm.ki[t + 3][c] * gC * r.w);
  }
  float acc[2][4];
  gram_half(warp % 2 ? sm.qd : sm.kd, sm.ki, kHeadDim / 2 * (warp / 2), g, t4, acc);
  if (warp >= 2) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
      sm.part[warp % 2][nt][lane] = make_float4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
  }
  __syncthreads();

  // Warps 0-1 add the halves and normalise in registers: L = strictly_lower(diag(b) kn kn^T)
  // (warp 0) and M = lower_incl(scale qn kn^T) (warp 1), kn = k / ||k||, qn = q / ||q|| (eps
  // inside the square root). Meanwhile warps 2-3 zero the upper-right 8x8 blocks of Ak and Av,
  // which the blocked inverse does not write.
  if (warp < 2) {
    float(*X)[kLS] = warp == 0 ? sm.m.L : sm.m.M;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const float4 h = sm.part[warp][nt][lane];
      acc[nt][0] += h.x, acc[nt][1] += h.y, acc[nt][2] += h.z, acc[nt][3] += h.w;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = g + 8 * half;
      const float si = warp == 0 ? sm.beta[i] * sm.rk[i] : sm.rq[i];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int j = 8 * nt + 2 * t4;
        const float2 rkj = *reinterpret_cast<const float2*>(&sm.rk[j]);
        // L keeps j < i, M j <= i: j < i + warp.
        const float v0 = j < i + warp ? acc[nt][2 * half] * si * rkj.x : 0.f;
        const float v1 = j + 1 < i + warp ? acc[nt][2 * half + 1] * si * rkj.y : 0.f;
        *reinterpret_cast<float2*>(&X[i][j]) = make_float2(v0, v1);
      }
    }
  } else {
    const int e = c - 64;  // 32 float4 stores: (Ak, Av) x 8 rows x 2 halves
    if (e < 32) {
      float(*X)[kSq] = e < 16 ? sm.m.Ak : sm.m.Av;
      *reinterpret_cast<float4*>(&X[e / 2 % 8][kChunk / 2 + 4 * (e % 2)]) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  __syncthreads();

  // Phase 3: (I + L)^-1 on warp 0, with I + L = [[I + A, 0], [C, I + D]] in 8x8 blocks:
  //   (I + L)^-1 = [[A', 0], [-D' C A', D']],  A' = (I + A)^-1, D' = (I + D)^-1.
  // A' and D' by forward substitution, one column per lane (lanes 0-7 A', 8-15 D'; 16-31
  // repeat 0-15, SIMT makes that free), the same operations as the unblocked substitution did
  // on those blocks; then Y = C A' and Z = D' Y with two entries per lane. Dependent chain:
  // 7 + 8 + 8 FMAs (the unblocked substitution: 15, with 120 FMAs a lane on 16 lanes).
  if (warp == 0) {
    const int jj = lane % 8, o = 8 * ((lane / 8) % 2);
    float x[kChunk / 2];
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) x[i] = i == jj ? 1.f : 0.f;
#pragma unroll
    for (int m = 0; m < kChunk / 2; ++m)
#pragma unroll
      for (int i = m + 1; i < kChunk / 2; ++i) x[i] -= sm.m.L[o + i][o + m] * x[m];
    float a[kChunk / 2];  // column lane % 8 of A'
#pragma unroll
    for (int m = 0; m < kChunk / 2; ++m) a[m] = __shfl_sync(0xffffffffu, x[m], jj);
    __syncwarp();  // every lane has read D before D' takes its place
    if (lane < kChunk) {
      const int j = o + jj;
      const float bj = sm.beta[j], rkj = sm.rk[j];
#pragma unroll
      for (int i = 0; i < kChunk / 2; ++i) {
        sm.m.Ak[o + i][j] = to_tf32(x[i] * bj * rkj);
        sm.m.Av[o + i][j] = x[i] * bj;
      }
      if (o != 0) {
#pragma unroll
        for (int i = 0; i < kChunk / 2; ++i) sm.m.L[o + i][j] = x[i];  // D' over D (zeros above the diagonal)
      }
    }
    // Lane l: column j = l % 8 of Y and Z, rows r and r + 4 (r = l / 8).
    const int r = lane / 8;
    float y[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float* Ci = &sm.m.L[kChunk / 2 + r + 4 * hh][0];
      float s = 0.f;
#pragma unroll
      for (int m = 0; m < kChunk / 2; ++m) s = fmaf(Ci[m], a[m], s);
      y[hh] = s;
    }
    float ym[kChunk / 2];  // column j of Y: Y[m][j] is y[m / 4] of lane 8 (m % 4) + j
#pragma unroll
    for (int m = 0; m < kChunk / 2; ++m) ym[m] = __shfl_sync(0xffffffffu, y[m / 4], 8 * (m % 4) + jj);
    __syncwarp();  // D' is in place
    const float bj = sm.beta[jj], rkj = sm.rk[jj];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int i = r + 4 * hh;
      const float* Di = &sm.m.L[kChunk / 2 + i][kChunk / 2];
      float s = 0.f;
#pragma unroll
      for (int m = 0; m < kChunk / 2; ++m) s = fmaf(Di[m], ym[m], s);
      sm.m.Ak[kChunk / 2 + i][jj] = to_tf32(-s * bj * rkj);
      sm.m.Av[kChunk / 2 + i][jj] = -s * bj;
    }
  }
  __syncthreads();

  // Phase 4: per m-tile of 16 channels, W^T = kd^T Ak^T. Thread c also takes its channel of
  // Qd = qd diag(scale / ||q||) into registers: the record is assembled over qd.
  uint32_t bAk[2][2][2];
  load_b16(sm.m.Ak, g, t4, bAk);
  float W[2][2][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) W[mt][nt][r] = 0.f;
    tile_times(sm.kd, 32 * warp + 16 * mt, g, t4, bAk, W[mt]);
  }
  float qd[kChunk];
#pragma unroll
  for (int t = 0; t < kChunk; t += 4) {
    const float4 r = *reinterpret_cast<const float4*>(&sm.rq[t]);
    qd[t] = sm.qd[t][c] * r.x, qd[t + 1] = sm.qd[t + 1][c] * r.y;
    qd[t + 2] = sm.qd[t + 2][c] * r.z, qd[t + 3] = sm.qd[t + 3][c] * r.w;
  }
  __syncthreads();  // kd and qd are dead: assemble the record over them

  // Phase 5: the record (params.h: bf16 tiles in wgmma's layout, gmma_tile_offset) is
  // assembled in shared memory. W and Qd go in as padded [token][channel] rows (assembled():
  // conflict-free stores from the mma fragments and from thread c's channel) and are reordered
  // into core matrices by the copy-out below; kr^T, Av, Av lo and M are stored in their final
  // order (thread c owns row c of kr^T: two 16-byte pieces).
  char* st = reinterpret_cast<char*>(&sm.kd[0][0]);
  auto* sW = reinterpret_cast<__nv_bfloat16*>(st + assembled(kRecW));
  auto* sQd = reinterpret_cast<__nv_bfloat16*>(st + assembled(kRecQd));
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {  // channels ch, ch + 1 of token t (tile_times)
        const int ch = 32 * warp + 16 * mt + 2 * g, t = 8 * nt + 2 * t4 + e;
        *reinterpret_cast<uint32_t*>(&sW[t * kAsmRow + ch]) = pack_bf16(W[mt][nt][e], W[mt][nt][e + 2]);
      }
    }
  }
  {
#pragma unroll
    for (int t = 0; t < kChunk; ++t) sQd[t * kAsmRow + c] = __float2bfloat16(qd[t]);
#pragma unroll
    for (int half = 0; half < 2; ++half)
      *reinterpret_cast<uint4*>(st + assembled(kRecKr + gmma_tile_offset(c, 8 * half, kChunk))) =
          make_uint4(kr[4 * half], kr[4 * half + 1], kr[4 * half + 2], kr[4 * half + 3]);
  }
  {  // Av (hi and lo) and M: 256 entries each, two per thread (the 16x16 matrices lie past the record)
    const int i = c / 8, j = 2 * (c % 8);
    const float a0 = sm.m.Av[i][j], a1 = sm.m.Av[i][j + 1];
    const uint32_t hi = pack_bf16(a0, a1);
    const float2 h = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&hi));
    const int at = gmma_tile_offset(i, j, kChunk);
    *reinterpret_cast<uint32_t*>(st + assembled(kRecAv + at)) = hi;
    *reinterpret_cast<uint32_t*>(st + assembled(kRecAvLo + at)) = pack_bf16(a0 - h.x, a1 - h.y);
    *reinterpret_cast<uint32_t*>(st + assembled(kRecM + at)) = pack_bf16(sm.m.M[i][j], sm.m.M[i][j + 1]);
  }
  reinterpret_cast<float*>(st + assembled(kRecGC))[c] = gC;
  __syncthreads();

  // Consecutive threads store consecutive 16-byte pieces of the record. A piece of W or Qd is
  // row r of core matrix m: token (m / 16) * 8 + r, channels 8 (m % 16) .. +7 of the padded
  // rows (8 lanes read 8 rows 272 bytes apart: conflict-free); every later piece is already
  // in place.
  char* rec = p.records + ((slot - p.slot_begin) * p.value_heads + hv) * int64_t(kRecordBytes);
  static_assert(kRecordBytes % (16 * kThreads) == 0, "every thread stores the same number of pieces");
  static_assert(kRecQd == kRecW + kChunk * kHeadDim * 2 && kRecKr == kRecQd + kChunk * kHeadDim * 2,
                "W and Qd are the record's first two tiles");
  static_assert(kRecKr % (16 * kThreads) == 0, "a store is W/Qd or in place by its n alone");
#pragma unroll
  for (int n = 0; n < kRecordBytes / (16 * kThreads); ++n) {
    const int i = c + n * kThreads;
    int src;
    if (n < kRecKr / (16 * kThreads)) {
      const int tile = i / (kChunk * kHeadDim * 2 / 16), m = (i / 8) % (kChunk * kHeadDim / 64), r = i % 8;
      src = assembled(tile * (kChunk * kHeadDim * 2) + ((m / 16) * 8 + r) * (kHeadDim * 2) + (m % 16) * 16);
    } else {
      src = assembled(16 * i);
    }
    reinterpret_cast<uint4*>(rec)[i] = *reinterpret_cast<const uint4*>(st + src);
  }
}

}  // namespace

cudaError_t launch_prepare(const PrepareParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.slot_end - p.slot_begin), static_cast<unsigned>(p.value_heads));
  PrepareParams q = p;
  q.group = p.value_heads / p.heads;
  prepare_kernel<<<grid, kThreads, 0, stream>>>(q);
  return cudaGetLastError();
}

}  // namespace flash_kda::sm90
