// The reverse state-gradient chain (the backward's only sequential part). Each value column of
// dS (the gradient of the state after the current chunk) evolves on its own, so one block per
// (sequence, value head, slice of kSlice value columns) walks its chunks from the last to the
// first with its K x kSlice slice of dS in fp32 registers. Per chunk, from the chunk's record
// (records.h; chunk_algebra.cuh's math):
//
//   dU = M^T dO + kr dS      dR = Tinv^T dU      dS <- diag(eg) dS + qd^T dO - kd^T diag(b) dR
//
// and it stores dS before the step (the chunk-gradient kernel's input, k-first fp32). dS
// starts at d_final_state (zero without it); what is left after the first chunk is
// d_initial_state. An empty sequence passes d_final_state through. The next chunk's record
// (cp.async) and d out rows (registers) load while the current chunk computes.
#include "sm90/backward/chunk_load.cuh"
#include "sm90/backward/kernels.h"
#include "sm90/backward/records.h"
#include "sm90/common/launch_config.h"
#include "sm90/common/ptx.cuh"

namespace flash_kda::sm90::bwd {
namespace {

constexpr int kSlice = 32;                      // value columns per block: a warp's lanes
constexpr int kSlices = kHeadDim / kSlice;      // blocks per (sequence, value head)
constexpr int kThreads = 256;                   // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = kHeadDim / kWarps;  // dS rows c = kRowsPerWarp * warp + r in a thread's registers
constexpr int kRecSpan = kRecordFloats - RecordField::kd;  // the record from kd on: what the chain reads
static_assert(kRecSpan % 4 == 0 && RecordField::kd % 4 == 0, "16-byte copies");

// Offsets of the record's fields in the shared copy (which starts at kd).
constexpr int kKd = 0;
constexpr int kQd = RecordField::qd - RecordField::kd;
constexpr int kKr = RecordField::kr - RecordField::kd;
constexpr int kEg = RecordField::eg - RecordField::kd;
constexpr int kM = RecordField::M - RecordField::kd;
constexpr int kTinv = RecordField::Tinv - RecordField::kd;
constexpr int kB = RecordField::b - RecordField::kd;

struct Smem {
  float rec[2][kRecSpan];           // the current and the next chunk's record
  float dS[kHeadDim][kSlice];       // dS of the current chunk's end, for dU
  float dO[2][kC][kSlice];          // the current and the next chunk's d out rows
  float dU[kC][kSlice];
  float bdR[kC][kSlice];            // diag(b) dR
};
constexpr int kSmemBytes = int(sizeof(Smem));

// Starts the copy of record `row` into rec (every thread a share of the 16-byte pieces).
__device__ __forceinline__ void fetch_record(const BackwardParams& p, int64_t row, int hv, float* rec) {
  const float* src = p.records + (row * p.value_heads + hv) * int64_t(kRecordFloats) + RecordField::kd;
  for (int e = threadIdx.x * 4; e < kRecSpan; e += kThreads * 4)
    ptx::cp_async_16(rec + e, src + e);
  ptx::cp_async_commit();
}

// A thread's two d out elements of a chunk: row i = tid / 16, columns 2 (tid % 16) and + 1 of
// the slice; zero past the chunk's `rows` tokens.
struct DoPair {
  float x = 0.f, y = 0.f;
};
__device__ __forceinline__ DoPair load_do(const BackwardParams& p, int64_t tok0, int rows, int hv, int col0) {
  const int i = threadIdx.x / 16, v = col0 + 2 * (threadIdx.x % 16);
  DoPair d;
  if (i < rows) {
    const int64_t tok = tok0 + i;
    const int64_t ln = layout_seq(tok, p.seqs.seqlen, p.seqs.cu_seqlens != nullptr);
    const char* row = static_cast<const char*>(p.d_out) + p.d_out_rows.offset(ln, tok, hv);
    if (p.d_out_is_f32) {
      const float2 f = *reinterpret_cast<const float2*>(row + int64_t(v) * 4);
      d.x = f.x;
      d.y = f.y;
    } else {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(row + int64_t(v) * 2));
      d.x = f.x;
      d.y = f.y;
    }
  }
  return d;
}

__global__ void __launch_bounds__(kThreads) chain_kernel(BackwardParams p) {
  Smem& s = *reinterpret_cast<Smem*>(dynamic_smem());
  const int64_t n = blockIdx.x;
  const int hv = blockIdx.y / kSlices;
  const int col0 = (blockIdx.y % kSlices) * kSlice;  // the slice's first value column
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t KV = int64_t(kHeadDim) * kHeadDim;
  const int64_t slice = (n * p.value_heads + hv) * KV;
  const int v = col0 + lane;

  float dS[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int c = kRowsPerWarp * warp + r;
    dS[r] = p.d_final_state ? load_f(p.d_final_state, slice + state_elem(p.state_k_first, c, v), p.d_final_is_f32) : 0.f;
  }

  const SeqIndex::Span sp = p.seqs.span(n);
  const int64_t chunks = (sp.length + kC - 1) / kC;
  auto rows_of = [&](int64_t j) { return int(sp.length - j * kC < kC ? sp.length - j * kC : kC); };
  int buf = 0;
  if (chunks > 0) {
    fetch_record(p, sp.first_slot + chunks - 1, hv, s.rec[0]);
    const DoPair d = load_do(p, sp.begin + (chunks - 1) * kC, rows_of(chunks - 1), hv, col0);
    s.dO[0][threadIdx.x / 16][2 * (threadIdx.x % 16)] = d.x;
    s.dO[0][threadIdx.x / 16][2 * (threadIdx.x % 16) + 1] = d.y;
  }
  for (int64_t j = chunks - 1; j >= 0; --j) {
    // dS of this chunk's end: to shared memory for dU, and to the workspace for chunk_grad.
    float* out = p.dstates + ((sp.first_slot + j) * p.value_heads + hv) * KV;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int c = kRowsPerWarp * warp + r;
      s.dS[c][lane] = dS[r];
      out[int64_t(c) * kHeadDim + v] = dS[r];
    }
    ptx::cp_async_wait<0>();
    __syncthreads();  // record j, d out rows j and dS visible to all

    // The next chunk's (j - 1) record and d out rows start loading.
    DoPair next;
    if (j > 0) {
      fetch_record(p, sp.first_slot + j - 1, hv, s.rec[buf ^ 1]);
      next = load_do(p, sp.begin + (j - 1) * kC, rows_of(j - 1), hv, col0);
    }
    const float* rec = s.rec[buf];
    const float(*dO)[kSlice] = s.dO[buf];

    // dU_i = sum_c kr_ic dS_c + sum_{m >= i} M_mi dO_m, rows i = warp and warp + 8: each dS load
    // serves both, kr comes 4 channels a load (the warp's lanes read the same address), and
    // each row sums in four partial sums (channel c mod 4), added in a fixed order at the end,
    // so that the dependent chains are a quarter as long.
    {
      const int i0 = warp, i1 = warp + kWarps;
      float a0[4] = {}, a1[4] = {};
#pragma unroll 4
      for (int c = 0; c < kHeadDim; c += 4) {
        const float4 k0 = *reinterpret_cast<const float4*>(rec + kKr + i0 * kHeadDim + c);
        const float4 k1 = *reinterpret_cast<const float4*>(rec + kKr + i1 * kHeadDim + c);
        const float d0 = s.dS[c][lane], d1 = s.dS[c + 1][lane], d2 = s.dS[c + 2][lane], d3 = s.dS[c + 3][lane];
        a0[0] += k0.x * d0;
        a0[1] += k0.y * d1;
        a0[2] += k0.z * d2;
        a0[3] += k0.w * d3;
        a1[0] += k1.x * d0;
        a1[1] += k1.y * d1;
        a1[2] += k1.z * d2;
        a1[3] += k1.w * d3;
      }
      float u0 = (a0[0] + a0[1]) + (a0[2] + a0[3]), u1 = (a1[0] + a1[1]) + (a1[2] + a1[3]);
      for (int m = i0; m < kC; ++m) u0 += rec[kM + m * kC + i0] * dO[m][lane];
      for (int m = i1; m < kC; ++m) u1 += rec[kM + m * kC + i1] * dO[m][lane];
      s.dU[i0][lane] = u0;
      s.dU[i1][lane] = u1;
    }
    __syncthreads();
    // diag(b) dR, dR_i = sum_{m >= i} Tinv_mi dU_m.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = warp + kWarps * h;
      float acc = 0.f;
      for (int m = i; m < kC; ++m) acc += rec[kTinv + m * kC + i] * s.dU[m][lane];
      s.bdR[i][lane] = rec[kB + i] * acc;
    }
    __syncthreads();
    // dS <- diag(eg) dS + qd^T dO - kd^T diag(b) dR.
    float o[kC], bdr[kC];
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      o[i] = dO[i][lane];
      bdr[i] = s.bdR[i][lane];
    }
    // The warp's 16 rows are contiguous channels: qd, kd and eg come 4 rows a load. The qd^T dO
    // and kd^T diag(b) dR sums run apart (chains half as long) and meet at the end.
    const int c0 = kRowsPerWarp * warp;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r += 4) {
      const float4 e = *reinterpret_cast<const float4*>(rec + kEg + c0 + r);
      float4 aq = make_float4(0.f, 0.f, 0.f, 0.f), ak = aq;
#pragma unroll
      for (int i = 0; i < kC; ++i) {
        const float4 qd = *reinterpret_cast<const float4*>(rec + kQd + i * kHeadDim + c0 + r);
        const float4 kd = *reinterpret_cast<const float4*>(rec + kKd + i * kHeadDim + c0 + r);
        aq.x += qd.x * o[i];
        aq.y += qd.y * o[i];
        aq.z += qd.z * o[i];
        aq.w += qd.w * o[i];
        ak.x += kd.x * bdr[i];
        ak.y += kd.y * bdr[i];
        ak.z += kd.z * bdr[i];
        ak.w += kd.w * bdr[i];
      }
      dS[r] = e.x * dS[r] + (aq.x - ak.x);
      dS[r + 1] = e.y * dS[r + 1] + (aq.y - ak.y);
      dS[r + 2] = e.z * dS[r + 2] + (aq.z - ak.z);
      dS[r + 3] = e.w * dS[r + 3] + (aq.w - ak.w);
    }
    if (j > 0) {
      s.dO[buf ^ 1][threadIdx.x / 16][2 * (threadIdx.x % 16)] = next.x;
      s.dO[buf ^ 1][threadIdx.x / 16][2 * (threadIdx.x % 16) + 1] = next.y;
    }
    buf ^= 1;
  }

  if (p.d_initial_state)
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int c = kRowsPerWarp * warp + r;
      store_f(p.d_initial_state, slice + state_elem(p.state_k_first, c, v), dS[r], p.d_initial_is_f32);
    }
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
