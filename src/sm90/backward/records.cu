// The record kernel: every chunk's record (records.h) from the prepared q_hat, k_hat, log decay
// a and b of the workspace, one block per (chunk row, value head), before the chain and the
// chunk gradients read it. Each exponential of a chunk is taken here once: every factor is
// exp of a difference of cumulative log decays that is <= 0 (or of G_i, GC themselves), so none
// overflows, however strong the decay.
#include "sm90/backward/kernels.h"
#include "sm90/backward/records.h"
#include "sm90/common/launch_config.h"
#include "sm90/common/seq_index.h"

namespace flash_kda::sm90::bwd {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) records_kernel(BackwardParams p) {
  const int64_t slot = blockIdx.x;
  const int hv = blockIdx.y;
  const int64_t n = p.seqs.seq_of_slot(slot);
  const SeqIndex::Span sp = p.seqs.span(n);
  const int64_t j0 = slot - sp.first_slot;  // the chunk of sequence n
  if (j0 < 0 || j0 * kC >= sp.length) return;  // a row no chunk owns: never read
  const int rows = int(sp.length - j0 * kC < kC ? sp.length - j0 * kC : kC);
  const int64_t tok0 = sp.begin + j0 * kC;
  const int h = hv / p.group;

  __shared__ float G[kC][kHeadDim], q[kC][kHeadDim], k[kC][kHeadDim];
  __shared__ float A[kC][kC], b[kC];
  float* rec = p.records + (slot * p.value_heads + hv) * int64_t(kRecordFloats);

  // Per channel: the cumulative decay and the three scaled key/query rows. Every load is issued
  // before the first store (the record could alias the inputs as far as the compiler knows).
  if (threadIdx.x < kHeadDim) {
    const int c = threadIdx.x;
    float a[kC], qv[kC], kv[kC];
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      const int64_t tok = tok0 + i;
      const bool real = i < rows;
      a[i] = real ? p.a[(tok * p.value_heads + hv) * kHeadDim + c] : 0.f;
      qv[i] = real ? p.q_hat[(tok * p.heads + h) * kHeadDim + c] : 0.f;
      kv[i] = real ? p.k_hat[(tok * p.heads + h) * kHeadDim + c] : 0.f;
    }
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      acc += a[i];
      G[i][c] = acc;
      q[i][c] = qv[i];
      k[i][c] = kv[i];
    }
    const float GC = acc;
    rec[RecordField::eg + c] = expf(GC);
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      const float e = expf(G[i][c]);
      rec[RecordField::G + i * kHeadDim + c] = G[i][c];
      rec[RecordField::kd + i * kHeadDim + c] = e * kv[i];
      rec[RecordField::qd + i * kHeadDim + c] = p.scale * e * qv[i];
      rec[RecordField::kr + i * kHeadDim + c] = expf(GC - G[i][c]) * kv[i];
    }
  } else if (threadIdx.x < kHeadDim + kC) {
    const int i = threadIdx.x - kHeadDim;
    b[i] = i < rows ? p.b[(tok0 + i) * p.value_heads + hv] : 0.f;
    rec[RecordField::b + i] = b[i];
  }
  __syncthreads();

  // The Grams, one thread per pair (i, j); the channel loop of pair (i, j) starts at channel j so
  // that the pairs of a warp read distinct banks.
  {
    const int i = threadIdx.x / kC, j = threadIdx.x % kC;
    float a = 0.f, m = 0.f;
    if (j <= i)
      for (int s = 0; s < kHeadDim; ++s) {
        const int c = (s + j) % kHeadDim;
        const float ek = expf(G[i][c] - G[j][c]) * k[j][c];
        a += k[i][c] * ek;
        m += q[i][c] * ek;
      }
    A[i][j] = j < i ? a : 0.f;
    rec[RecordField::A + i * kC + j] = j < i ? a : 0.f;
    rec[RecordField::M + i * kC + j] = j <= i ? p.scale * m : 0.f;
  }
  __syncthreads();

  // Tinv = (I + diag(b) A)^-1 by forward substitution, one thread per column j:
  // Tinv_ij = [i == j] - b_i sum_{j <= m < i} A_im Tinv_mj.
  if (threadIdx.x < kC) {
    const int j = threadIdx.x;
    float col[kC];
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      float acc = i == j ? 1.f : 0.f;
#pragma unroll
      for (int m = 0; m < i; ++m) acc -= b[i] * A[i][m] * col[m];
      col[i] = i < j ? 0.f : acc;
      rec[RecordField::Tinv + i * kC + j] = col[i];
    }
  }
}

}  // namespace

cudaError_t launch_records(const BackwardParams& p, cudaStream_t stream) {
  if (p.total_tokens == 0) return cudaSuccess;
  KernelLaunch k;
  k.grid_x = unsigned(p.rows);
  k.grid_y = unsigned(p.value_heads);
  k.block = kThreads;
  return launch_planned<records_kernel>(k, 0, p, stream);  // no dynamic shared memory: no context key
}

}  // namespace flash_kda::sm90::bwd
