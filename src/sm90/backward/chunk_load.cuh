// Loading one chunk of one (sequence, value head) into the tiles of chunk_algebra.cuh, shared by
// the chain and chunk-gradient kernels: q_hat, k_hat, the log decay a (into G, cumulated later),
// b and d out, and optionally v. Rows past the chunk's `rows` tokens are zero (chunk_algebra.cuh
// says why that is exact).
#pragma once

#include <cuda_bf16.h>

#include "sm90/backward/chunk_algebra.cuh"
#include "sm90/backward/device_util.cuh"
#include "sm90/backward/params.h"
#include "sm90/common/bf16.cuh"
#include "sm90/common/dynamic_smem.cuh"
#include "sm90/common/record.h"

namespace flash_kda::sm90::bwd {

using Tiles = ChunkTiles<float, kHeadDim, kHeadDim>;

/// A block's threads as chunk_algebra.cuh's Ctx.
struct BlockCtx {
  int tid, nthreads;
  __device__ void sync() const { __syncthreads(); }
};

/// Loads the chunk whose first token is `tok0` (flat) with `rows` tokens, value head hv, of
/// sequence n into t (q, k, G, dO, b; X = v when with_v). Ends with a barrier.
__device__ inline void load_chunk(const BackwardParams& p, const Tiles& t, int64_t n, int64_t tok0, int rows,
                                  int hv, bool with_v) {
  const int h = hv / p.group;
  const bool varlen = p.seqs.cu_seqlens != nullptr;
  for (int e = threadIdx.x; e < kC * kHeadDim; e += blockDim.x) {
    const int i = e / kHeadDim, c = e % kHeadDim;
    float q = 0.f, k = 0.f, a = 0.f, o = 0.f, v = 0.f;
    if (i < rows) {
      const int64_t tok = tok0 + i;
      q = p.q_hat[(tok * p.heads + h) * kHeadDim + c];
      k = p.k_hat[(tok * p.heads + h) * kHeadDim + c];
      a = p.a[(tok * p.value_heads + hv) * kHeadDim + c];
      const int64_t ln = layout_seq(tok, p.seqs.seqlen, varlen);
      o = load_f_at(p.d_out, p.d_out_rows.offset(ln, tok, hv) + int64_t(c) * (p.d_out_is_f32 ? 4 : 2), p.d_out_is_f32);
      if (with_v)
        v = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(static_cast<const char*>(p.v) +
                                                                     p.v_rows.offset(ln, tok, hv))[c]);
    }
    t.q[e] = q;
    t.k[e] = k;
    t.G[e] = a;
    t.dO[e] = o;
    if (with_v) t.X[e] = v;
  }
  for (int i = threadIdx.x; i < kC; i += blockDim.x) t.b[i] = i < rows ? p.b[(tok0 + i) * p.value_heads + hv] : 0.f;
  __syncthreads();
}

/// Element (key c, value v) of a state in the call's layout, at `base` (a [K x V] slice).
__device__ __forceinline__ int64_t state_elem(bool k_first, int c, int v) {
  return k_first ? int64_t(c) * kHeadDim + v : int64_t(v) * kHeadDim + c;
}

}  // namespace flash_kda::sm90::bwd
