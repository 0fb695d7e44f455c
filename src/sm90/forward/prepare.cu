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

// Issues the cp.async of the chunk's rows of one tensor (row of token tok: (tok * heads + head)
// * kRowBytes bytes from src), kRowBytes / 128 per thread, into the padded tile. Rows past
// the sequence end are zero-filled (src-size 0, nothing read); their address is clamped to the
// last valid row all the same, so no address outside the tensor is ever formed.
template <typename T>
__device__ __forceinline__ void stage_rows(void* dst, const void* src, int64_t t0, int valid, int64_t heads,
                                           int64_t head, int c) {
  using Copy = cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>;
  constexpr int kRowBytes = kHeadDim * int(sizeof(T)), kPieces = kRowBytes / 16;
  static_assert(kThreads % kPieces == 0, "a thread keeps its piece j of every row it copies");
  constexpr int kRowsPerPass = kThreads / kPieces;
  const int j = c % kPieces;
  // One 64-bit product per tensor; the rows are then a 32 x 64-bit multiply-add each.
  const char* row0 = static_cast<const char*>(src) + (t0 * heads + head) * kRowBytes + j * 16;
  const int64_t stride = heads * kRowBytes;
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

// 7 blocks per SM (<= 72 registers, 7 x 26 KB of shared memory): each block runs its phases one
// after the other, with warps idle at the barriers, which only other resident blocks can fill.
// At 8 blocks (64 registers) the kernel spills and takes longer on the small cases
// (h4_fixed_1024: 9.3 against 7.3 us) for the same time on the large ones (docs/performance.md).
// kGF32: g is fp32 (else bf16), a template parameter so that the gate's loads have one path.
template <bool kGF32>
__global__ void __launch_bounds__(kThreads, 7) prepare_kernel(const PrepareParams p) {
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
  stage_rows<__nv_bfloat16>(sm.in.q, p.q, t0, valid, p.heads, h, c);
  stage_rows<__nv_bfloat16>(sm.in.k, p.k, t0, valid, p.heads, h, c);
  if constexpr (kGF32)
    stage_rows<float>(sm.g32, p.g, t0, valid, p.value_heads, hv, c);
  else
    stage_rows<__nv_bfloat16>(sm.g16, p.g, t0, valid, p.value_heads, hv, c);
  if (c < kHeadDim / 4)  // 16-byte pieces (validate.cpp: tensors are 16-byte aligned)
    cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>::copy(
        reinterpret_cast<const cute::uint128_t*>(p.dt_bias + hv * kHeadDim)[c],
        reinterpret_cast<cute::uint128_t*>(sm.bias)[c]);
  cute::cp_async_fence();
  // The remaining global loads go out while the copies are in flight.
  const int ch0 = 32 * warp;
  const float a_log = p.A_log[hv];
  if (c < kChunk) {
    sm.beta[c] = c < valid ? math::beta_sigmoid_log2(load_f(p.beta, (t0 + c) * p.value_heads + hv, p.beta_is_f32), ptx::FastMath{})
                           : 0.f;
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
    rq[th] = p.scale * ptx::rsqrt((sq.x + sq.y) + (sq.z + sq.w) + float(math::kL2NormEps));
    rk[th] = ptx::rsqrt((sk.x + sk.y) + (sk.z + sk.w) + float(math::kL2NormEps));
  }
  if (warp == 0 && t4 == 0) {  // for the normalisation and the inverse, past the next barrier
#pragma unroll
    for (int th = 0; th < 2; ++th) sm.rk[g + 8 * th] = rk[th];
  }

  // The cumulative gate of group j in log2 units, in the C layout (tokens g + 8 th, channels
  // 2 t4, 2 t4 + 1 of the group), as Tri a over two k-steps of 8 tokens. The lane's B values
  // are a at channel 8 j + g, tokens 8 ks + 2 t4, +1 (the transposed ldmatrix's pair), so k-slot
  // t4 stands for token 8 ks + 2 t4 and slot t4 + 4 for the next one. The gate is the log2 form
  // of common/gate.h (math::safe_gate_log2, derived there from the fp64 safe_gate); with the safe
  // gate G >= 16 lower_bound >= -80, so 2^(+-G2) stays inside fp32's range. a = hi + lo with hi a's top
  // 11 bits (exact in tf32) and lo the rest (rounded to tf32: ~2^-22 of a); Tri is exact.
  const ptx::FastMath fm;
  const math::SafeGateLog2<float> gate2 = math::safe_gate_log2_head(a_log, p.lower_bound, fm);
  const float rate2 = gate2.rate2;
  // Tri's A fragments for the k-steps ks = 0, 1 (rows g, g + 8; k-slots t4, t4 + 4 = tokens
  // 8 ks + 2 t4, +1): two lane predicates and the constants 1 and 0.
  const uint32_t one = __float_as_uint(1.f), lo4 = g >= 2 * t4 ? one : 0u, hi4 = g >= 2 * t4 + 1 ? one : 0u;
  const uint32_t tri[2][4] = {{lo4, one, hi4, one}, {0u, lo4, 0u, hi4}};
  // graw: group j's transposed ldmatrix of g's tile, token halves ks = 0, 1 (bf16 g; unused for fp32 g).
  auto gate = [&](int j, const uint32_t(&graw)[2], float(&G2)[4]) {
    const int ch = ch0 + 8 * j + g;
    const float x0 = sm.bias[ch] * rate2;
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
      const float a = t < valid ? math::safe_gate_log2(x, x0, gate2, fm) : 0.f;
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
    float kd[4], ki[4], qd[4];
#pragma unroll
    for (int th = 0; th < 2; ++th) {
      const float2 qf = unpack_bf16(qa[th]), kf = unpack_bf16(ka[th]);
      const float e0 = ptx::ex2(G2[2 * th]), e1 = ptx::ex2(G2[2 * th + 1]);
      kd[2 * th] = kf.x * e0, kd[2 * th + 1] = kf.y * e1;
      qd[2 * th] = qf.x * e0, qd[2 * th + 1] = qf.y * e1;
      ki[2 * th] = kf.x * ptx::ex2(-G2[2 * th]), ki[2 * th + 1] = kf.y * ptx::ex2(-G2[2 * th + 1]);
    }
    {  // Grams over this group's 8 channels (k-slots t4, t4 + 4 = channels 2 t4, 2 t4 + 1), the
       // operands as fp32 bits (see ptx::tf32's note above)
      auto u = [](float x) { return __float_as_uint(x); };
      const uint32_t b[2][2] = {{u(ki[0]), u(ki[1])}, {u(ki[2]), u(ki[3])}};
      const uint32_t ad[4] = {u(kd[0]), u(kd[2]), u(kd[1]), u(kd[3])};
      const uint32_t aq[4] = {u(qd[0]), u(qd[2]), u(qd[1]), u(qd[3])};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        MmaTf32::fma(accL[nt][0], accL[nt][1], accL[nt][2], accL[nt][3], ad[0], ad[1], ad[2], ad[3], b[nt][0],
                     b[nt][1], accL[nt][0], accL[nt][1], accL[nt][2], accL[nt][3]);
        MmaTf32::fma(accM[nt][0], accM[nt][1], accM[nt][2], accM[nt][3], aq[0], aq[1], aq[2], aq[3], b[nt][0],
                     b[nt][1], accM[nt][0], accM[nt][1], accM[nt][2], accM[nt][3]);
      }
    }
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

}  // namespace

cudaError_t launch_prepare(const PrepareParams& p, const KernelLaunch& k, uint64_t context_key, cudaStream_t stream) {
  return p.g_is_f32 ? launch_planned<prepare_kernel<true>>(k, context_key, p, stream)
                    : launch_planned<prepare_kernel<false>>(k, context_key, p, stream);
}

}  // namespace flash_kda::sm90
