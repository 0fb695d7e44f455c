// Stage 1: the intra-chunk algebra, one chunk record (common/record.h; docs/kda-spec.md
// "Record form": W, Qd, kr, Av and Av lo, M, gC) per (chunk slot, value head). One 4-warp
// block per record; everything here is independent of the state, so all chunks of all heads
// run at once.
//
// The products run on tensor cores (fla's Triton kernels do the same: tl.dot of fp32 operands
// is tf32), with fp32 accumulation; the records are bf16 anyway. The per-token, per-channel
// operands never go through shared memory: a lane of warp w owns, for each of the warp's four
// 8-channel groups, tokens {g, g + 8} x channels {2 t4, 2 t4 + 1} of the group (g = lane / 4,
// t4 = lane % 4): the C layout of an m16n8 mma. That one layout is also the A operand of the
// tf32 Grams (k-slot t4 <-> channel 2 t4, slot t4 + 4 <-> channel 2 t4 + 1: a sum over
// channels does not care which slot holds which channel) and, token half by token half, their
// B operand. Keeping fp32 kd / ki / qd tiles in shared memory instead runs at 88% of L1
// throughput (1,668 wavefronts a record); this layout at ~50%, bound by issue and by the
// latency of its loads (~4,400 warp-instructions a record, DRAM at ~74% of peak;
// docs/performance.md). Phases:
//   1. the chunk's q, k and g rows (and dt_bias) are staged in shared memory by 16-byte
//      cp.async, rows padded so that ldmatrix is conflict-free; the squared norms of q_t and
//      k_t are the diagonals of the bf16 Grams q q^T and k k^T (tensor cores, fed by the same
//      ldmatrix fragments); the cumulative gate G of the lane's positions is a tensor-core
//      product G = Tri a (Tri the 16 x 16 lower-triangular ones; a from a transposed ldmatrix
//      of g, in the B layout, as tf32 hi + lo parts, so that G keeps ~fp32 accuracy);
//   2. per group: kd = k e^G, ki = k e^-G, qd = q e^G in registers; the Grams kd ki^T (-> L)
//      and qd ki^T (-> M) over the warp's channels; Qd = qd scale / ||q|| and
//      kr = ki e^{G_C} / ||k|| straight into the record (kr transposed by movmatrix); kd kept as
//      bf16 hi + lo, transposed by movmatrix into W's B operand;
//   3. the four warps' partial Grams are summed and normalised (L = strictly_lower(diag(b)
//      kn kn^T) on warp 0, M = lower_incl(scale qn kn^T) on warp 1, which stores it to the
//      record); (I + L)^-1 as a 2 x 2 blocked inverse of 8 x 8 blocks on warp 0, right after
//      its L;
//   4. W = Ak kd on bf16 hi + lo operands (three mmas a group: ~fp32 accuracy), into the
//      record; Av (hi and lo) into the record (gC went there in phase 2). v is not read here:
//      the recurrence applies Av to it.
// Every warp store of W, Qd and kr writes one whole 128-byte core matrix of the record's tile
// (params.h, gmma_tile_offset), so the record goes out without being assembled first.
#include <cuda_bf16.h>

#include <type_traits>

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/mma_sm80.hpp>

#include "common/gate.h"
#include "sm90/common/bf16.cuh"
#include "sm90/common/launch_config.h"
#include "sm90/common/ptx.cuh"
#include "sm90/forward/kernel_shapes.h"
#include "sm90/forward/kernels.h"

namespace flash_kda::sm90 {
namespace {

using MmaTf32 = cute::SM80_16x8x8_F32TF32TF32F32_TN;
using MmaBf16 = cute::SM80_16x8x16_F32BF16BF16F32_TN;

constexpr int kThreads = kPrepareThreads;  // 4 warps
constexpr int kGroups = 4;          // 8-channel groups per warp
constexpr int kSq = kChunk + 4;     // row stride of Ak and Av
// Row stride of L and M: 24 = 24 (mod 32) makes the float2 stores from mma fragments
// conflict-free per half-warp, puts the inverse's two diagonal 8x8 blocks of L 8 banks apart
// (lanes 0-7 and 8-15 read them in the same instruction), and keeps rows 16-byte aligned for
// the blocked inverse's row reads.
constexpr int kLS = kChunk + 8;
// Row stride, in elements, of the staged input rows (staged()).
constexpr int kStageRow = kHeadDim + 8;

// Shared memory, ~26 KB. The 16x16 matrices take the place of the staged q and k rows, which
// every warp has read before the barrier that precedes them.
struct Smem {
  union {
    struct {
      __nv_bfloat16 q[kChunk][kStageRow], k[kChunk][kStageRow];  // padded (staged())
    } in;
    struct {
      float L[kChunk][kLS];   // strictly lower, normalised, times beta; its lower-right 8x8 block becomes that block's inverse
      float Ak[kChunk][kSq];  // (I+L)^-1 diag(beta / ||k||): W = Ak k e^G
      float Av[kChunk][kSq];  // (I+L)^-1 diag(beta):         U = Av v - W S
    } m;
  };
  union {
    __nv_bfloat16 g16[kChunk][kStageRow];  // padded
    float g32[kChunk][kStageRow];          // padded; g_is_f32
  };
  // Partial Grams, [L / M][warp][n-tile][lane] in mma fragment order: the summing warp reads
  // exactly the positions it holds, 16-byte accesses, no conflicts.
  float4 part[2][kThreads / 32][2][32];
  // Per token, each warp's sum over its 32 channels of q_t^2 ([0]) and k_t^2 ([1]): one
  // 16-byte read gives a lane all four warps' sums.
  alignas(16) float sumsq[2][kChunk][kThreads / 32];
  float bias[kHeadDim];  // dt_bias of the head, staged with the rows
  float beta[kChunk];
  float rk[kChunk];  // 1 / ||k_t|| (eps inside the square root)
};
static_assert(sizeof(Smem::m) <= sizeof(Smem::in), "the 16x16 matrices fit over q and k");
static_assert(sizeof(Smem) == kPrepareSmemBytes, "the plan's reservations assume this size");
static_assert(sizeof(Smem) <= 31 * 1024, "7 blocks of 128 threads fit an SM (228 KB, 1 KB reserved a block)");

// The staged rows are padded to 136 elements (272 bytes bf16, 544 bytes fp32): the 8 rows of an
// ldmatrix 8x8 matrix are then 68 words apart, 4 banks, and its 8 x 16 bytes cover all 32 banks
// once. (An fp32 g value at token 8 ks + 2 t4 + e, channel 32 w + 8 j + g, is at bank
// 16 t4 + g + const: a 2-way conflict on the rare fp32-g path.) Each address is a per-lane base
// plus a constant; an XOR swizzle by token (no padding) is as conflict-free but costs ~3 integer
// instructions an access, in a kernel bound by issue.
template <typename T>
__device__ __forceinline__ int staged(int t, int b) {
  return t * kStageRow * int(sizeof(T)) + b;
}

// Byte offset of the row of (sequence n, sequence-local token tl, head h) of a tensor: RowLayout::
// offset with the token made local once per block (tl = t - n * seq_tokens; every tensor of a
// call has the same seq_tokens). n, tl and h are below 2^31 (validate.cpp: N < 2^31; a tensor of
// 2^31 tokens would not fit a device), so each product is a 32 x 64-bit one (two instructions).
__device__ __forceinline__ int64_t row_offset(const RowLayout& r, uint32_t n, uint32_t tl, uint32_t h) {
  return int64_t(uint64_t(n) * uint64_t(r.seq_stride) + uint64_t(tl) * uint64_t(r.token_stride) +
                 uint64_t(h) * uint64_t(r.head_stride));
}

// Issues the cp.async of the chunk's rows of one tensor (row of token t: row_offset(rows, seq,
// tl + t, head) bytes from src, with tl the chunk's first sequence-local token), kRowBytes / 128
// per thread, into the padded tile. Rows past the sequence end are zero-filled (src-size 0,
// nothing read); their address is clamped to the last valid row all the same, so no address
// outside the tensor is ever formed.
template <typename T>
__device__ __forceinline__ void stage_rows(void* dst, const void* src, const RowLayout& rows, uint32_t seq, uint32_t tl,
                                           int valid, uint32_t head, int c) {
  using Copy = cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>;
  constexpr int kRowBytes = kHeadDim * int(sizeof(T)), kPieces = kRowBytes / 16;
  static_assert(kThreads % kPieces == 0, "a thread keeps its piece j of every row it copies");
  constexpr int kRowsPerPass = kThreads / kPieces;
  const int j = c % kPieces;
  // One row offset per tensor; the rows are then a 32 x 64-bit multiply-add each.
  const char* row0 = static_cast<const char*>(src) + row_offset(rows, seq, tl, head) + j * 16;
  const int64_t stride = rows.token_stride;
#pragma unroll
  for (int n = 0; n < kChunk / kRowsPerPass; ++n) {
    const int t = c / kPieces + n * kRowsPerPass;
    const char* s = row0 + (t < valid ? t : valid - 1) * stride;
    Copy::copy(*reinterpret_cast<const cute::uint128_t*>(s),
               *reinterpret_cast<cute::uint128_t*>(static_cast<char*>(dst) + staged<T>(t, j * 16)), t < valid);
  }
}

// The Grams' operands skip ptx::tf32: given fp32 bits, the tensor cores drop the low 13
// (truncation, as Triton's tf32 dots of fp32 values do), and the four cvt a group are ~4% of the
// kernel's instructions for no measurable accuracy (accuracy grid max ours / fla 1.00 either
// way, docs/performance.md). The gate's lo parts keep it (they feed a product whose accuracy
// matters: the cumulative gate).

__device__ __forceinline__ void store32(char* p, uint32_t x) { *reinterpret_cast<uint32_t*>(p) = x; }

__device__ __forceinline__ uint32_t f32_bits(float x) { return __float_as_uint(x); }

// Both Grams over one group's 8 channels (k-slots t4, t4 + 4 = channels 2 t4, 2 t4 + 1):
// accL += kd ki^T and accM += qd ki^T, the operands in the C layout (index 2 th + e: token
// g + 8 th, channel 2 t4 + e), n-tile nt's columns the tokens 8 nt .. 8 nt + 7 (ki[2 nt + e] of
// lane g is column g), as fp32 bits (see ptx::tf32's note above).
__device__ __forceinline__ void grams(float (&accL)[2][4], float (&accM)[2][4], const float (&kd)[4],
                                      const float (&qd)[4], const float (&ki)[4]) {
  const uint32_t b[2][2] = {{f32_bits(ki[0]), f32_bits(ki[1])}, {f32_bits(ki[2]), f32_bits(ki[3])}};
  const uint32_t ad[4] = {f32_bits(kd[0]), f32_bits(kd[2]), f32_bits(kd[1]), f32_bits(kd[3])};
  const uint32_t aq[4] = {f32_bits(qd[0]), f32_bits(qd[2]), f32_bits(qd[1]), f32_bits(qd[3])};
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    MmaTf32::fma(accL[nt][0], accL[nt][1], accL[nt][2], accL[nt][3], ad[0], ad[1], ad[2], ad[3], b[nt][0], b[nt][1],
                 accL[nt][0], accL[nt][1], accL[nt][2], accL[nt][3]);
    MmaTf32::fma(accM[nt][0], accM[nt][1], accM[nt][2], accM[nt][3], aq[0], aq[1], aq[2], aq[3], b[nt][0], b[nt][1],
                 accM[nt][0], accM[nt][1], accM[nt][2], accM[nt][3]);
  }
}

// One Gram, n-tiles kNt0 .. kNt1 - 1 only: acc[nt] += a b_nt^T (layouts as in grams).
template <int kNt0, int kNt1>
__device__ __forceinline__ void gram(float (&acc)[2][4], const float (&a)[4], const float (&b)[4]) {
  const uint32_t au[4] = {f32_bits(a[0]), f32_bits(a[2]), f32_bits(a[1]), f32_bits(a[3])};
#pragma unroll
  for (int nt = kNt0; nt < kNt1; ++nt)
    MmaTf32::fma(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3], au[0], au[1], au[2], au[3], f32_bits(b[2 * nt]),
                 f32_bits(b[2 * nt + 1]), acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
}

// ---- Unbounded gates (Softplus, PreGated): the Grams without exp(-G) overflowing.
//
// Of the record, W = Ak k e^G, Qd = q e^G scale / ||q|| and gC = e^{G_C} only use factors <= 1
// (G is the within-chunk inclusive cumulative log decay, <= 0 and non-increasing) and kr =
// k e^{G_C - G} / ||k|| is computed with a factor <= 1 as well. Only the Grams L = kd ki^T and
// M = qd ki^T pair e^G with e^-G, whose entries (i, j) with j <= i, k_i . k_j e^{G_i - G_j} per
// channel, are <= |k_i| |k_j| but whose factors overflow fp32 once |G| passes ~128 log2 units,
// which a chunk of the softplus gate reaches at ~5.5 nats a token. Each (warp, 8-channel
// group) takes, warp-uniformly, the first of three exact forms that fits:
//   direct: max |G2| <= kDirectBound2 over the group's 16 tokens: the safe gate's own form
//     (kd = k 2^G, ki = k 2^-G; operands <= |k| 2^100, finite for |k| < 2^27). Taken for
//     nearly every group of fla's benchmark inputs (A_log ~ U(0, 1), dt_bias ~ U(0, 1),
//     g ~ N(0, 1): G2 at token 15 is 43 +- 16 log2 units; 0.7% of groups pass 100, in a
//     simulation of 64 heads x 2,000 chunks);
//   mid: max |G2 - R| <= kMidBound2 with R = G2 at token 7 (the chunk middle) per channel: the
//     Grams of kd = k 2^{G - R}, qd = q 2^{G - R}, ki = k 2^{R - G} (the same products, each
//     factor <= 2^100), kr = ki 2^{G_C - R}. It needs each half chunk's decay below 100 log2
//     units (~8.7 nats a token): every group of the same simulation fits (largest 82);
//   levels: any decay. A per-token reference R_t shared by a token's row factor 2^{G_i - R}
//     and its column factor 2^{R - G_j} makes entry (i, j) exact when R_i = R_j and both factors
//     are <= 1, i.e. G_i <= R <= G_j: true for the blocks
//       level 1: R = G_7 for all, rows 8..15 x columns 0..7;
//       level 2: R = G_3 (tokens 0..7), G_11 (8..15), rows 4..7 x columns 0..3 and 12..15 x 8..11;
//       level 3: R = G_{4b+1}, rows 4b+2..4b+3 x columns 4b..4b+1;
//       level 4: R = G_{2m}, row 2m+1 x column 2m;
//       diagonal (M only): factor 1, q_i . k_i;
//     which tile j <= i exactly. In each level a token is either a row (factor 2^{G - R} <= 1) or
//     a column (2^{R - G} <= 1) of the kept blocks, never both, so it takes one 2^(.) and the
//     other operand is 0; a level's entries are selected (not multiplied: the others are sums
//     of unrelated products) into the warp's accumulators before the cross-warp sum. No factor
//     of a kept entry exceeds 1, so no clamping is needed; factors below 2^-126 flush to 0,
//     an absolute error below 2^-126 |k_i| |k_j|.
// The entries j > i that the direct and mid forms compute may be inf or NaN; finish() selects
// j <= i only (the safe gate relies on the same). Per group the check costs 4 FMNMX, a vote and
// a branch over the safe gate's instructions; mid adds 6 MUFU and ~20 ALU per lane.
// The forms assume a <= 0 (the contract, docs/kda-spec.md); a positive pre-gated decay is
// served exactly while |G2| stays within the direct or mid bound and is unspecified past it.
constexpr float kDirectBound2 = 100.f;
constexpr float kMidBound2 = 100.f;
// Per-token floor of a2 (log2 units) for the unbounded gates: 2^-2^100 is 0 in fp32 anyway.
constexpr float kDecayFloor2 = 0x1p100f;

// acc[th][2 th + e] += keep_e ? t[th][2 th + e] : 0 for th = 0, 1: the entries of the two
// diagonal 8x8 token blocks (n-tile = token half) of a level's Gram `t` that the level keeps.
__device__ __forceinline__ void add_kept(float (&acc)[2][4], const float (&t)[2][4], bool keep0, bool keep1) {
#pragma unroll
  for (int th = 0; th < 2; ++th) {
    acc[th][2 * th] += keep0 ? t[th][2 * th] : 0.f;
    acc[th][2 * th + 1] += keep1 ? t[th][2 * th + 1] : 0.f;
  }
}

// The levels form (above) of one 8-channel group: adds the exact entries j <= i of k ki^T
// decayed (levels 1-4: the strictly lower part, all L needs) to accL and of q ki^T decayed
// (levels 1-4 and the diagonal) to accM. q, k, G2 in the C layout of lane `lane` (index 2 th + e:
// token g + 8 th, channel 2 t4 + e); R7 = G2 at token 7 of channels 2 t4 + e. Warp-uniform.
__device__ __forceinline__ void level_grams(const float (&q)[4], const float (&k)[4], const float (&G2)[4],
                                         const float (&R7)[2], float (&accL)[2][4], float (&accM)[2][4], int lane) {
  const int g = lane / 4, t4 = lane % 4;
  {  // Level 1: rows 8..15 (th = 1) x columns 0..7 (n-tile 0, th = 0 of each lane); rows 0..7 of
     // A are 0, so n-tile 0 goes straight into the accumulators, and n-tile 1 is not computed.
    float ak[4], aq[4], b[4];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float fr = ptx::ex2(G2[2 + e] - R7[e]), fc = ptx::ex2(R7[e] - G2[e]);
      ak[e] = aq[e] = 0.f;
      ak[2 + e] = k[2 + e] * fr, aq[2 + e] = q[2 + e] * fr;
      b[e] = k[e] * fc, b[2 + e] = 0.f;
    }
    gram<0, 1>(accL, ak, b);
    gram<0, 1>(accM, aq, b);
  }
  // Levels 2-4 inside each token half: `src` is the lane holding this lane's reference token
  // (same channels, same half), `row` whether the lane's tokens are rows (else columns) of the
  // kept blocks; entries between a row and a column of different blocks are dropped by keep_e.
  auto level = [&](int src, bool row, bool keep0, bool keep1) {
    float ak[4], aq[4], b[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float R = __shfl_sync(0xffffffffu, G2[r], src);
      const float f = ptx::ex2(row ? G2[r] - R : R - G2[r]);
      ak[r] = row ? k[r] * f : 0.f;
      aq[r] = row ? q[r] * f : 0.f;
      b[r] = row ? 0.f : k[r] * f;
    }
    {  // one Gram's temporaries at a time: the level pass runs beside every accumulator
      float t[2][4] = {};
      gram<0, 2>(t, ak, b);
      add_kept(accL, t, keep0, keep1);
    }
    float t[2][4] = {};
    gram<0, 2>(t, aq, b);
    add_kept(accM, t, keep0, keep1);
  };
  level(12 + t4, g >= 4, true, true);                                            // R = G_3, G_11
  level(16 * (g / 4) + 4 + t4, g % 4 >= 2, g / 4 == t4 / 2, g / 4 == t4 / 2);  // R = G_{4b+1}
  level(8 * (g / 2) + t4, g % 2 == 1, 2 * t4 == g - 1, false);                    // R = G_{2m}
  {  // the diagonal of M: q_i . k_i, factor 1
    float tM[2][4] = {};
    gram<0, 2>(tM, q, k);
    add_kept(accM, tM, 2 * t4 == g, 2 * t4 + 1 == g);
  }
}

// Blocks per SM of each gate's instantiation: the unbounded gates' three forms need more
// registers (80 at 6 blocks; at 7, 72 registers, they spill ~60 bytes inside the group loop).
template <GateMode kGate>
inline constexpr int kPrepareBlocksPerSm = kGate == GateMode::SafeSigmoid ? 7 : 6;

// 7 blocks per SM (<= 72 registers, 7 x 26 KB of shared memory): each block runs its phases one
// after the other, with warps idle at the barriers, which only other resident blocks can fill.
// At 8 blocks (64 registers) the kernel spills and takes longer on the small cases
// (h4_fixed_1024: 9.3 against 7.3 us) for the same time on the large ones (docs/performance.md).
// kGF32: g is fp32 (else bf16), a template parameter so that the gate's loads have one path;
// kGate: the gate mode (the safe gate's instantiations compile to its bounded form alone).
// kRows: how q, k, g and beta are addressed (PrepareParams::row_form, chosen by
// prepare_row_form in plan.cpp). General: RowLayout::offset, any batch stride. Flat: the batch
// folded into the flat token (RowLayout::flattened): without the batch term and the per-block
// local token the safe gate fits 72 registers with no spill (General: 7 spill pairs, bf16 g).
// Dense: every input dense, constant strides (FlashKDA's own call alone).
// kFlashKDA: FlashKDA's flags (PrepareParams::flashkda_flags; safe gate only) are constants
// here, so its call costs no instruction of the other modes, whatever its rows' form.
template <bool kGF32, GateMode kGate, RowForm kRows, bool kFlashKDA>
__global__ void __launch_bounds__(kThreads, kPrepareBlocksPerSm<kGate>) prepare_kernel(const PrepareParams p) {
  static_assert(!kFlashKDA || kGate == GateMode::SafeSigmoid, "FlashKDA's call is the safe gate's");
  static_assert(kRows != RowForm::Dense || kFlashKDA, "the dense form is FlashKDA's call's");
  __shared__ __align__(16) Smem sm;
  // The state pass is this kernel's programmatic dependent launch (plan.cpp): once every block
  // has started, i.e. in the last wave, its blocks may take the SMs this grid leaves idle and
  // load their initial states; they wait for this grid's completion before reading a record.
  cudaTriggerProgrammaticLaunchCompletion();

  // The warp index broadcast from lane 0 (CUTLASS's canonical_warp_idx_sync): ptxas then knows
  // that branches on it are warp-uniform (with c / 32, the shuffles inside warp 0's inverse
  // got divergence wrappers).
  const int c = threadIdx.x, lane = c % 32, warp = __shfl_sync(0xffffffffu, c / 32, 0);
  // Without the bound ptxas treats c as possibly negative and every c / 2^n, c % 2^n costs a
  // sign fix-up.
  __builtin_assume(c >= 0 && c < kThreads);
  const int g = lane / 4, t4 = lane % 4;  // mma fragment coordinates
  // GVA (group > 1) is rare: the common case skips the division.
  const int hv = blockIdx.y, h = p.group == 1 ? hv : hv / p.group;
  const int64_t slot = p.slot_begin + blockIdx.x;
  const int64_t n = p.seqs.seq_of_slot(slot);
  const SeqIndex::Span span = p.seqs.span(n);
  const int64_t chunk = slot - span.first_slot, seq_begin = span.begin, seq_len = span.length;
  // An empty slot (no record is read for it), or bad cu_seqlens values (see SeqIndex::start).
  if (chunk < 0 || chunk * kChunk >= seq_len) return;
  const int64_t t0 = seq_begin + chunk * kChunk;
  const int valid = static_cast<int>(seq_len - chunk * kChunk < kChunk ? seq_len - chunk * kChunk : kChunk);

  // Phase 1. Tokens past the sequence end are zero (k = q = 0, b = 0, a = 0; their staged
  // rows are zero-filled, and may lie past the end of the tensors): they then leave U, S and the
  // chunk decay untouched, so the recurrence needs no masks.
  // The chunk's first token, local to its sequence (row_offset): chunk * 16 for fixed length,
  // the flat token t0 for varlen (seq_tokens = 0).
  // Flat and Dense rows: addressed by the flat token t0 with sequence stride 0
  // (RowLayout::flattened, dense_of); dense_of's constant strides fold into the addressing.
  auto rows = [&](const RowLayout& r, int heads, int row_bytes) {
    return kRows == RowForm::Dense ? RowLayout::dense_of(heads, row_bytes)
                                   : kRows == RowForm::Flat ? r.flattened() : r;
  };
  const RowLayout q_rows = rows(p.q_rows, p.heads, 2 * kHeadDim);
  const RowLayout k_rows = rows(p.k_rows, p.heads, 2 * kHeadDim);
  const RowLayout g_rows = rows(p.g_rows, p.value_heads, (kGF32 ? 4 : 2) * kHeadDim);
  const RowLayout beta_rows = rows(p.beta_rows, p.value_heads, p.beta_is_f32 ? 4 : 2);
  const uint32_t tl =
      static_cast<uint32_t>(kRows != RowForm::General || p.q_rows.seq_tokens == 0 ? t0 : chunk * kChunk);
  const uint32_t n32 = static_cast<uint32_t>(n);
  stage_rows<__nv_bfloat16>(sm.in.q, p.q, q_rows, n32, tl, valid, h, c);
  stage_rows<__nv_bfloat16>(sm.in.k, p.k, k_rows, n32, tl, valid, h, c);
  if constexpr (kGF32)
    stage_rows<float>(sm.g32, p.g, g_rows, n32, tl, valid, hv, c);
  else
    stage_rows<__nv_bfloat16>(sm.g16, p.g, g_rows, n32, tl, valid, hv, c);
  if (kGate != GateMode::PreGated && c < kHeadDim / 4) {  // 16-byte pieces (validate.cpp: tensors are 16-byte aligned)
    if (kFlashKDA || p.dt_bias != nullptr)
      cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>::copy(
          reinterpret_cast<const cute::uint128_t*>(p.dt_bias + hv * kHeadDim)[c],
          reinterpret_cast<cute::uint128_t*>(sm.bias)[c]);
    else
      reinterpret_cast<float4*>(sm.bias)[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  cute::cp_async_fence();
  // The remaining global loads go out while the copies are in flight.
  const int ch0 = 32 * warp;
  const float a_log = kGate != GateMode::PreGated && (kFlashKDA || p.A_log != nullptr) ? p.A_log[hv] : 0.f;
  if (c < kChunk) {
    float b = 0.f;
    if (c < valid) {
      b = load_f_at(p.beta, row_offset(beta_rows, n32, tl + c, hv), p.beta_is_f32);
      if (kFlashKDA) b = math::beta_sigmoid_log2(b, ptx::FastMath{});
      else if (p.beta_sigmoid) b = math::beta_sigmoid_log2(b, ptx::FastMath{}) * p.beta_mul;
    }
    sm.beta[c] = b;
  }
  cute::cp_async_wait<0>();
  // Also what orders the reads below after the wait: CuTe's cp.async asm has no memory clobber.
  __syncthreads();

  // ldmatrix of a staged bf16 tile: lanes 0-7 address tokens 0-7 of 8 channels, 8-15 tokens 8-15,
  // 16-31 the same of the next 8 (x4 only); at byte offset 16 j, group j's channels. Untransposed
  // (q, k), register th of a group holds tokens g + 8 th x channels ch0 + 8 j + 2 t4, +1 as a
  // bf16 pair: the C layout of phase 2, and with the next group's two the A fragment of an
  // m16n8k16 product. Transposed (g), register ks holds tokens 8 ks + 2 t4, +1 of channel
  // ch0 + 8 j + g: the B fragment of the gate's Tri a below.
  const int ld_off = staged<__nv_bfloat16>(lane % 8 + 8 * (lane / 8 % 2), 2 * (ch0 + 8 * (lane / 16)));
  const char* sq = reinterpret_cast<const char*>(sm.in.q);
  const char* sk = reinterpret_cast<const char*>(sm.in.k);
  auto frag = [&](const char* tile, int s, uint32_t(&x)[4]) {
    cute::SM75_U32x4_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(tile + ld_off + 32 * s), x[0], x[1],
                                  x[2], x[3]);
  };
  {
    // ||q_t||^2 and ||k_t||^2 over the warp's 32 channels, as the diagonals of the Grams q q^T and
    // k k^T on tensor cores (bf16 products are exact in fp32). A fragment of 16 tokens is, token
    // half by token half, the B fragment of 8 of them, so one ldmatrix feeds both operands.
    float d[2][2][4] = {};  // [q / k][n-tile: tokens 0-7 / 8-15][C fragment]
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        uint32_t a[4];
        frag(x == 0 ? sq : sk, s, a);
        float(&e)[2][4] = d[x];
        MmaBf16::fma(e[0][0], e[0][1], e[0][2], e[0][3], a[0], a[1], a[2], a[3], a[0], a[2], e[0][0], e[0][1],
                     e[0][2], e[0][3]);
        MmaBf16::fma(e[1][0], e[1][1], e[1][2], e[1][3], a[0], a[1], a[2], a[3], a[1], a[3], e[1][0], e[1][1],
                     e[1][2], e[1][3]);
      }
    // Diagonal entry (i, i) sits with lane g = i % 8, t4 = g / 2: element g % 2 of n-tile 0
    // (i < 8), element 2 + g % 2 of n-tile 1 (i >= 8).
    if (t4 == g / 2) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        sm.sumsq[x][g][warp] = g % 2 ? d[x][0][1] : d[x][0][0];
        sm.sumsq[x][g + 8][warp] = g % 2 ? d[x][1][3] : d[x][1][2];
      }
    }
  }

  __syncthreads();  // the warps' sums of squares are in

  // 1 / ||k_t|| and scale / ||q_t|| for this lane's tokens g, g + 8 (eps inside the square root;
  // rows past the sequence end are zero: rsqrt(eps), finite).
  float rq[2], rk[2];
#pragma unroll
  for (int th = 0; th < 2; ++th) {
    const float4 sq = *reinterpret_cast<const float4*>(sm.sumsq[0][g + 8 * th]);
    const float4 sk = *reinterpret_cast<const float4*>(sm.sumsq[1][g + 8 * th]);
    const bool l2norm = kFlashKDA || p.l2norm;
    rq[th] = p.scale * (l2norm ? ptx::rsqrt((sq.x + sq.y) + (sq.z + sq.w) + float(math::kL2NormEps)) : 1.f);
    rk[th] = l2norm ? ptx::rsqrt((sk.x + sk.y) + (sk.z + sk.w) + float(math::kL2NormEps)) : 1.f;
  }
  if (warp == 0 && t4 == 0) {  // for the normalisation and the inverse, past the next barrier
#pragma unroll
    for (int th = 0; th < 2; ++th) sm.rk[g + 8 * th] = rk[th];
  }

  // The cumulative gate of group j in log2 units, in the C layout (tokens g + 8 th, channels
  // 2 t4, 2 t4 + 1 of the group), as Tri a over two k-steps of 8 tokens. The lane's B values
  // are a at channel 8 j + g, tokens 8 ks + 2 t4, +1 (the transposed ldmatrix's pair), so k-slot
  // t4 stands for token 8 ks + 2 t4 and slot t4 + 4 for the next one. The gate is the log2 form
  // of common/gate.h (math::safe_gate_log2, softplus_gate_log2_biased, pre_gate_log2, derived
  // there from the fp64 forms); with the safe gate G >= 16 lower_bound >= -80, so 2^(+-G2)
  // stays inside fp32's range (the other gates: "Unbounded gates" above). a = hi + lo with hi a's
  // top 11 bits (exact in tf32) and lo the rest (rounded to tf32: ~2^-22 of a); Tri is exact.
  const ptx::FastMath fm;
  const math::SafeGateLog2<float> gate2 = math::safe_gate_log2_head(a_log, p.lower_bound, fm);
  // The factor of dt_bias in the gate's FMA: rate2 for the safe gate, log2(e) for the softplus
  // gate, whose per-head factor is neg_rate = -exp(A_log).
  const float rate2 = kGate == GateMode::SafeSigmoid ? gate2.rate2 : float(math::kLog2e);
  const float neg_rate = kGate == GateMode::Softplus ? -fm.exp(a_log) : 0.f;
  // Tri's A fragments for the k-steps ks = 0, 1 (rows g, g + 8; k-slots t4, t4 + 4 = tokens
  // 8 ks + 2 t4, +1): two lane predicates and the constants 1 and 0.
  const uint32_t one = __float_as_uint(1.f), lo4 = g >= 2 * t4 ? one : 0u, hi4 = g >= 2 * t4 + 1 ? one : 0u;
  const uint32_t tri[2][4] = {{lo4, one, hi4, one}, {0u, lo4, 0u, hi4}};
  // a2 of gate input x (g) for a channel with x0 = dt_bias rate2.
  auto gate_log2 = [&](float x, float x0) {
    if constexpr (kGate == GateMode::SafeSigmoid) {
      return math::safe_gate_log2(x, x0, gate2, fm);
    } else {
      const float a = kGate == GateMode::Softplus ? math::softplus_gate_log2_biased(x, x0, neg_rate, fm)
                                                  : math::pre_gate_log2(x);
      // A decay below 2^-2^100 a token is 0 in fp32 either way; the floor keeps the sums of 16
      // of them (and a = -inf from g log2(e) near -FLT_MAX) finite. A comparison, not fmaxf:
      // a NaN gate stays NaN (as in the fp64 reference and fla) instead of becoming the floor.
      return a < -kDecayFloor2 ? -kDecayFloor2 : a;
    }
  };
  // graw: group j's transposed ldmatrix of g's tile, token halves ks = 0, 1 (bf16 g; unused for fp32 g).
  auto gate = [&](int j, const uint32_t(&graw)[2], float(&G2)[4]) {
    const int ch = ch0 + 8 * j + g;
    const float x0 = sm.bias[ch] * rate2;  // unused for PreGated
    uint32_t bhi[4], blo[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // k-step i / 2: k-slots t4, t4 + 4 hold tokens 8 (i / 2) + 2 t4, +1
      const int t = 8 * (i / 2) + 2 * t4 + i % 2;
      float x;
      if constexpr (kGF32) {
        x = *reinterpret_cast<const float*>(reinterpret_cast<const char*>(sm.g32) + staged<float>(t, 4 * ch));
      } else {
        const float2 pr = unpack_bf16(graw[i / 2]);
        x = i % 2 ? pr.y : pr.x;
      }
      const float a = t < valid ? gate_log2(x, x0) : 0.f;
      bhi[i] = __float_as_uint(a) & 0xffffe000u;
      blo[i] = ptx::tf32(a - __uint_as_float(bhi[i]));
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) G2[r] = 0.f;
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const uint32_t(&t)[4] = tri[ks];
      MmaTf32::fma(G2[0], G2[1], G2[2], G2[3], t[0], t[1], t[2], t[3], bhi[2 * ks], bhi[2 * ks + 1], G2[0], G2[1],
                   G2[2], G2[3]);
      MmaTf32::fma(G2[0], G2[1], G2[2], G2[3], t[0], t[1], t[2], t[3], blo[2 * ks], blo[2 * ks + 1], G2[0], G2[1],
                   G2[2], G2[3]);
    }
  };

  // Phase 2, per group: the gate, the decayed operands, the Grams, Qd and kr into the record,
  // kd kept.
  char* rec = p.records + ((slot - p.slot_begin) * p.value_heads + hv) * int64_t(kRecordBytes);
  // This lane's 4-byte pieces of the W / Qd tiles (row g, channels ch0 + 2 t4, +1) and of kr^T
  // (row ch0 + g, tokens 2 t4, +1); groups and token halves are constant offsets from them.
  char* const rec_t = rec + gmma_tile_offset(g, ch0 + 2 * t4, kHeadDim);
  char* const rec_kr = rec + kRecKr + gmma_tile_offset(ch0 + g, 2 * t4, kChunk);
  float accL[2][4] = {}, accM[2][4] = {};
  uint32_t kdB[kGroups][2][2];  // W's B operand: [group][hi / lo][token half], after movmatrix
  float gc_own[2] = {0.f, 0.f};  // the chunk decay of group g (lanes g < 4), for the record
  unsigned slow = 0;  // unbounded gates: bit j = group j's Grams take the levels form (warp-uniform)
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
    // Group j's two 8x8 matrices of each tile (addressed by lanes 0-15): one group at a time, as
    // two groups' fragments (frag) held through the gate make ptxas spill at 72 registers.
    uint32_t qa[2], ka[2], ga[2] = {};
    cute::SM75_U32x2_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(sq + ld_off + 16 * j), qa[0], qa[1]);
    cute::SM75_U32x2_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(sk + ld_off + 16 * j), ka[0], ka[1]);
    if constexpr (!kGF32)
      cute::SM75_U16x4_LDSM_T::copy(
          *reinterpret_cast<const cute::uint128_t*>(reinterpret_cast<const char*>(sm.g16) + ld_off + 16 * j), ga[0],
          ga[1]);
    float G2[4];
    gate(j, ga, G2);
    if constexpr (kGate == GateMode::SafeSigmoid) {
      float kd[4], ki[4], qd[4];
#pragma unroll
      for (int th = 0; th < 2; ++th) {
        const float2 qf = unpack_bf16(qa[th]), kf = unpack_bf16(ka[th]);
        const float e0 = ptx::ex2(G2[2 * th]), e1 = ptx::ex2(G2[2 * th + 1]);
        kd[2 * th] = kf.x * e0, kd[2 * th + 1] = kf.y * e1;
        qd[2 * th] = qf.x * e0, qd[2 * th + 1] = qf.y * e1;
        ki[2 * th] = kf.x * ptx::ex2(-G2[2 * th]), ki[2 * th + 1] = kf.y * ptx::ex2(-G2[2 * th + 1]);
      }
      grams(accL, accM, kd, qd, ki);
      // The chunk decay of channels ch0 + 8 j + 2 t4, +1: G at token 15, held by lane (g = 7, t4).
      const float gc0 = ptx::ex2(__shfl_sync(0xffffffffu, G2[2], 28 + t4));
      const float gc1 = ptx::ex2(__shfl_sync(0xffffffffu, G2[3], 28 + t4));
      if (g == j) gc_own[0] = gc0, gc_own[1] = gc1;
#pragma unroll
      for (int th = 0; th < 2; ++th) {
        // Qd rows g + 8 th: one 128-byte core matrix per warp store.
        store32(rec_t + kRecQd + gmma_tile_offset(8 * th, 8 * j, kHeadDim),
                pack_bf16(qd[2 * th] * rq[th], qd[2 * th + 1] * rq[th]));
        // kr^T: the lane's token pair of channel ch0 + 8 j + g after the transpose.
        const uint32_t kr = ptx::transpose8x8(pack_bf16(ki[2 * th] * gc0 * rk[th], ki[2 * th + 1] * gc1 * rk[th]));
        store32(rec_kr + gmma_tile_offset(8 * j, 8 * th, kChunk), kr);
        uint32_t hi, lo;
        split_bf16(kd[2 * th], kd[2 * th + 1], hi, lo);
        kdB[j][0][th] = ptx::transpose8x8(hi);
        kdB[j][1][th] = ptx::transpose8x8(lo);
      }
    } else {
      // One group of the unbounded gates (the forms above): Qd, kr^T and kd's W operand into the
      // record and kdBj, gC kept for the record, both Grams into accL and accM.
      auto unbounded_group = [&](int j, const uint32_t(&qa)[2], const uint32_t(&ka)[2], const float(&G2)[4],
                                 float(&accL)[2][4], float(&accM)[2][4], uint32_t(&kdBj)[2][2], float(&gc_own)[2],
                                 unsigned& slow) {
        constexpr unsigned kAll = 0xffffffffu;
        float q[4], k[4], kd[4], qd[4];
#pragma unroll
        for (int th = 0; th < 2; ++th) {
          const float2 qf = unpack_bf16(qa[th]), kf = unpack_bf16(ka[th]);
          q[2 * th] = qf.x, q[2 * th + 1] = qf.y, k[2 * th] = kf.x, k[2 * th + 1] = kf.y;
        }
        // W's and Qd's factors 2^G <= 1 in every form.
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float e = ptx::ex2(G2[r]);
          kd[r] = k[r] * e, qd[r] = q[r] * e;
        }
        // G2 at token 15 (the chunk decay) and at token 7 (mid's reference), held by lane (g = 7, t4).
        const float GC[2] = {__shfl_sync(kAll, G2[2], 28 + t4), __shfl_sync(kAll, G2[3], 28 + t4)};
        const float R[2] = {__shfl_sync(kAll, G2[0], 28 + t4), __shfl_sync(kAll, G2[1], 28 + t4)};
        const float gc[2] = {ptx::ex2(GC[0]), ptx::ex2(GC[1])};
        if (g == j) gc_own[0] = gc[0], gc_own[1] = gc[1];
        float big = 0.f;
#pragma unroll
        for (int r = 0; r < 4; ++r) big = fmaxf(big, fabsf(G2[r]));
        float kr[4];  // k 2^{G_C - G}, each form's way
        if (!__any_sync(kAll, big > kDirectBound2)) {  // direct: the safe gate's form
          float ki[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) ki[r] = k[r] * ptx::ex2(-G2[r]);
          grams(accL, accM, kd, qd, ki);
#pragma unroll
          for (int r = 0; r < 4; ++r) kr[r] = ki[r] * gc[r % 2];
        } else {
          float far = 0.f;
#pragma unroll
          for (int r = 0; r < 4; ++r) far = fmaxf(far, fabsf(G2[r] - R[r % 2]));
          if (!__any_sync(kAll, far > kMidBound2)) {  // mid: every factor relative to G at token 7
            float kdr[4], qdr[4], kir[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const float f = ptx::ex2(G2[r] - R[r % 2]);
              kdr[r] = k[r] * f, qdr[r] = q[r] * f;
              kir[r] = k[r] * ptx::ex2(R[r % 2] - G2[r]);
            }
            grams(accL, accM, kdr, qdr, kir);
            const float cr[2] = {ptx::ex2(GC[0] - R[0]), ptx::ex2(GC[1] - R[1])};
#pragma unroll
            for (int r = 0; r < 4; ++r) kr[r] = kir[r] * cr[r % 2];
          } else {  // levels: the Grams after this loop (the level pass); kr needs none
#pragma unroll
            for (int r = 0; r < 4; ++r) kr[r] = k[r] * ptx::ex2(GC[r % 2] - G2[r]);
            slow |= 1u << j;
          }
        }
#pragma unroll
        for (int th = 0; th < 2; ++th) {
          store32(rec_t + kRecQd + gmma_tile_offset(8 * th, 8 * j, kHeadDim),
                  pack_bf16(qd[2 * th] * rq[th], qd[2 * th + 1] * rq[th]));
          store32(rec_kr + gmma_tile_offset(8 * j, 8 * th, kChunk),
                  ptx::transpose8x8(pack_bf16(kr[2 * th] * rk[th], kr[2 * th + 1] * rk[th])));
          uint32_t hi, lo;
          split_bf16(kd[2 * th], kd[2 * th + 1], hi, lo);
          kdBj[0][th] = ptx::transpose8x8(hi);
          kdBj[1][th] = ptx::transpose8x8(lo);
        }
      };
      unbounded_group(j, qa, ka, G2, accL, accM, kdB[j], gc_own, slow);
    }
  }
  if constexpr (kGate != GateMode::SafeSigmoid) {
    // The groups whose decay the direct and mid forms cannot take: their Grams by levels, one
    // group at a time in a rolled loop (rare: out of the unrolled loop above, whose registers
    // it would otherwise crowd), from the staged rows and the gate recomputed.
#pragma unroll 1
    for (int j = 0; j < kGroups; ++j) {
      if (!(slow >> j & 1u)) continue;
      uint32_t qa[2], ka[2], ga[2] = {};
      cute::SM75_U32x2_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(sq + ld_off + 16 * j), qa[0], qa[1]);
      cute::SM75_U32x2_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(sk + ld_off + 16 * j), ka[0], ka[1]);
      if constexpr (!kGF32)
        cute::SM75_U16x4_LDSM_T::copy(
            *reinterpret_cast<const cute::uint128_t*>(reinterpret_cast<const char*>(sm.g16) + ld_off + 16 * j), ga[0],
            ga[1]);
      float G2[4], q[4], k[4];
      gate(j, ga, G2);
#pragma unroll
      for (int th = 0; th < 2; ++th) {
        const float2 qf = unpack_bf16(qa[th]), kf = unpack_bf16(ka[th]);
        q[2 * th] = qf.x, q[2 * th + 1] = qf.y, k[2 * th] = kf.x, k[2 * th + 1] = kf.y;
      }
      const float R7[2] = {__shfl_sync(0xffffffffu, G2[0], 28 + t4), __shfl_sync(0xffffffffu, G2[1], 28 + t4)};
      level_grams(q, k, G2, R7, accL, accM, lane);
    }
  }
  if (g < kGroups)  // channels ch0 + 8 g + 2 t4, +1
    *reinterpret_cast<float2*>(rec + kRecGC + 4 * (ch0 + 8 * g + 2 * t4)) = make_float2(gc_own[0], gc_own[1]);
  // Partial Grams: L to warp 0 from the others, M to warp 1.
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    if (warp != 0) sm.part[0][warp][nt][lane] = make_float4(accL[nt][0], accL[nt][1], accL[nt][2], accL[nt][3]);
    if (warp != 1) sm.part[1][warp][nt][lane] = make_float4(accM[nt][0], accM[nt][1], accM[nt][2], accM[nt][3]);
  }
  __syncthreads();  // the partial Grams are in; q and k are dead (the 16x16 matrices go there)

  // Phase 3. Warps 0-1 add the partials and normalise in registers: L = strictly_lower(diag(b)
  // kn kn^T) (warp 0, into shared memory, then straight into the inverse below) and M =
  // lower_incl(scale qn kn^T) (warp 1, to the record as bf16), kn = k / ||k||, qn = q / ||q||.
  // Meanwhile warps 2-3 zero the upper-right 8x8 blocks of Ak and Av, which the blocked inverse
  // does not write.
  // The matrix is chosen by a compile-time index: a reference picked at run time would put
  // both accumulator arrays in local memory.
  auto finish = [&](auto which_tag, float(&acc)[2][4]) {
    constexpr int which = decltype(which_tag)::value;  // 0: L, 1: M
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) {
      if (w == which) continue;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const float4 x = sm.part[which][w][nt][lane];
        acc[nt][0] += x.x, acc[nt][1] += x.y, acc[nt][2] += x.z, acc[nt][3] += x.w;
      }
    }
#pragma unroll
    for (int th = 0; th < 2; ++th) {
      const int i = g + 8 * th;
      const float si = which == 0 ? sm.beta[i] * rk[th] : rq[th];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int j = 8 * nt + 2 * t4;
        // L keeps j < i, M j <= i: j < i + which.
        const float v0 = j < i + which ? acc[nt][2 * th] * si * sm.rk[j] : 0.f;
        const float v1 = j + 1 < i + which ? acc[nt][2 * th + 1] * si * sm.rk[j + 1] : 0.f;
        if constexpr (which == 0)
          *reinterpret_cast<float2*>(&sm.m.L[i][j]) = make_float2(v0, v1);
        else  // M goes to the record from here, as bf16
          store32(rec + kRecM + gmma_tile_offset(i, j, kChunk), pack_bf16(v0, v1));
      }
    }
  };
  if (warp == 0) {
    finish(std::integral_constant<int, 0>{}, accL);
  } else if (warp == 1) {
    finish(std::integral_constant<int, 1>{}, accM);
  } else {
    const int e = c - 64;  // 32 float4 stores: (Ak, Av) x 8 rows x 2 halves
    if (e < 32) {
      float(*X)[kSq] = e < 16 ? sm.m.Ak : sm.m.Av;
      *reinterpret_cast<float4*>(&X[e / 2 % 8][kChunk / 2 + 4 * (e % 2)]) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  // No block barrier here: warp 0 alone reads L, and the zeroed blocks are phase 4's.

  // (I + L)^-1 on warp 0, with I + L = [[I + A, 0], [C, I + D]] in 8x8 blocks:
  //   (I + L)^-1 = [[A', 0], [-D' C A', D']],  A' = (I + A)^-1, D' = (I + D)^-1.
  // A' and D' by forward substitution, one column per lane (lanes 0-7 A', 8-15 D'; 16-31
  // repeat 0-15, SIMT makes that free); then Y = C A' and Z = D' Y with two entries per lane.
  // Dependent chain: 7 + 8 + 8 FMAs.
  if (warp == 0) {
    __syncwarp();  // this warp's L is in
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
        sm.m.Ak[o + i][j] = x[i] * bj * rkj;
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
      sm.m.Ak[kChunk / 2 + i][jj] = -s * bj * rkj;
      sm.m.Av[kChunk / 2 + i][jj] = -s * bj;
    }
  }
  __syncthreads();

  // Phase 4: W = Ak kd per group (rows = tokens, bf16 hi + lo on both sides; Ak lo x kd lo,
  // ~2^-16 relative, is left out), then Av (hi and lo): 256 entries each, two per thread.
  {
    uint32_t ahi[4], alo[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // A fragment: rows g + 8 (r % 2), columns 2 t4 + 8 (r / 2), +1
      const float2 x = *reinterpret_cast<const float2*>(&sm.m.Ak[g + 8 * (r % 2)][2 * t4 + 8 * (r / 2)]);
      split_bf16(x.x, x.y, ahi[r], alo[r]);
    }
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      float w[4] = {0.f, 0.f, 0.f, 0.f};
      MmaBf16::fma(w[0], w[1], w[2], w[3], ahi[0], ahi[1], ahi[2], ahi[3], kdB[j][0][0], kdB[j][0][1], w[0], w[1],
                   w[2], w[3]);
      MmaBf16::fma(w[0], w[1], w[2], w[3], ahi[0], ahi[1], ahi[2], ahi[3], kdB[j][1][0], kdB[j][1][1], w[0], w[1],
                   w[2], w[3]);
      MmaBf16::fma(w[0], w[1], w[2], w[3], alo[0], alo[1], alo[2], alo[3], kdB[j][0][0], kdB[j][0][1], w[0], w[1],
                   w[2], w[3]);
#pragma unroll
      for (int th = 0; th < 2; ++th)
        store32(rec_t + kRecW + gmma_tile_offset(8 * th, 8 * j, kHeadDim), pack_bf16(w[2 * th], w[2 * th + 1]));
    }
  }
  {
    const int i = c / 8, j = 2 * (c % 8);
    const float a0 = sm.m.Av[i][j], a1 = sm.m.Av[i][j + 1];
    uint32_t hi, lo;
    split_bf16(a0, a1, hi, lo);
    const int at = gmma_tile_offset(i, j, kChunk);
    store32(rec + kRecAv + at, hi);
    store32(rec + kRecAvLo + at, lo);
  }
}

template <GateMode kGate, RowForm kRows, bool kFlashKDA = false>
cudaError_t launch_form(const PrepareParams& p, const KernelLaunch& k, uint64_t context_key, cudaStream_t stream) {
  return p.g_is_f32 ? launch_planned<prepare_kernel<true, kGate, kRows, kFlashKDA>>(k, context_key, p, stream)
                    : launch_planned<prepare_kernel<false, kGate, kRows, kFlashKDA>>(k, context_key, p, stream);
}

// Every gate has the General and Flat forms with its flags read at run time. FlashKDA's flags
// (the safe gate's alone) have the Dense form (its contiguous call) and the Flat one (its call
// on views of a fused projection, which then costs what the contiguous one does); with inputs
// that are not flat they take the General form, flags at run time.
template <GateMode kGate>
cudaError_t launch_gate(const PrepareParams& p, const KernelLaunch& k, uint64_t context_key, cudaStream_t stream) {
  if constexpr (kGate == GateMode::SafeSigmoid) {
    if (p.row_form == RowForm::Dense) return launch_form<kGate, RowForm::Dense, true>(p, k, context_key, stream);
    if (p.row_form == RowForm::Flat && p.flashkda_flags)
      return launch_form<kGate, RowForm::Flat, true>(p, k, context_key, stream);
  }
  return p.row_form == RowForm::General ? launch_form<kGate, RowForm::General>(p, k, context_key, stream)
                                        : launch_form<kGate, RowForm::Flat>(p, k, context_key, stream);
}

}  // namespace

cudaError_t launch_prepare(const PrepareParams& p, const KernelLaunch& k, uint64_t context_key, cudaStream_t stream) {
  switch (p.gate) {
    case GateMode::Softplus:
      return launch_gate<GateMode::Softplus>(p, k, context_key, stream);
    case GateMode::PreGated:
      return launch_gate<GateMode::PreGated>(p, k, context_key, stream);
    default:
      return launch_gate<GateMode::SafeSigmoid>(p, k, context_key, stream);
  }
}

}  // namespace flash_kda::sm90
