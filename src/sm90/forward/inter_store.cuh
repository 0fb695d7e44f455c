// Intermediate states (InterStates) stored through shared memory: the consumer warps write the
// block's part of the state into a staging buffer laid out as the destination's rows, and the
// TMA engine copies each row out (cp.async.bulk, shared to global).
//
// Why not straight from registers: a state is 64 KB a chunk (fp32), and a lane's fragment holds
// pairs 8 bytes wide (v-first) or single elements (k-first), so each warp store instruction
// writes 4-8 short segments. The chain's next product overwrites the registers those stores
// read, so it waits for the stores to leave the SM's store queue: with states every chunk the
// state pass runs at ~10-15 GB/s an SM (docs/notes/2026-12-02_backward-stalls.md). Shared-memory
// stores leave the registers at once, and the bulk copies move whole rows (128-512 bytes)
// while the chain goes on; the next store waits only for the copies to have read the buffer.
//
// The staging buffer (kernel_shapes.h, InterStaging) holds the destination's rows over this
// block's columns, each padded by 16 bytes (v-first: NW*16 rows of v, k-first: kHeadDim rows of
// k). The k-first and bf16 fragment stores then meet each bank once a wavefront; the v-first
// fp32 ones (8 bytes a lane, rows 4 banks apart) meet some banks twice within a half-warp, 4
// wavefronts a store where 2 would do. Row r goes to its place in the head's state by one bulk
// copy, issued by consumer thread r.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include <cuda/ptx>

#include "sm90/forward/kernel_shapes.h"
#include "sm90/forward/recurrence_passes.cuh"

namespace flash_kda::sm90 {

/// Named barrier 1 over the NW consumer warps (the producer warp, where there is one, never
/// takes part: it has left the store path).
template <int NW>
__device__ __forceinline__ void consumer_barrier() {
  asm volatile("bar.sync 1, %0;" ::"r"(NW * 32) : "memory");
}

/// Stores this block's part of the state s (each consumer lane's fragment, StateRegs) into the
/// head state at element offset `base` of `states` (v-first or k-first, fp32 or bf16) through
/// the staging buffer at `staging`. Every consumer thread calls it (block-uniform arguments).
/// The copies it issues are still running when it returns: the next call waits for them to
/// have read the buffer, and inter_store_drain for them to be done.
template <int NW>
__device__ __forceinline__ void store_state_staged(char* staging, void* states, bool is_f32, bool k_first,
                                                   int64_t base, const StateRegs& s, int v_block, int v0, int g,
                                                   int t4, int tid) {
  using St = InterStaging<NW>;
  const int esize = is_f32 ? 4 : 2;
  const int pitch = St::pitch(k_first, esize);
  // The previous state's copies have read the buffer (each thread waits for its own) before any
  // thread overwrites it.
  cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
  consumer_barrier<NW>();
  if (!k_first) {
    for_each_state_pair(v0, g, t4, [&](int nt, int half, int v, int k) {
      char* at = staging + (v - v_block) * pitch + k * esize;
      if (is_f32)
        *reinterpret_cast<float2*>(at) = make_float2(s[nt][2 * half], s[nt][2 * half + 1]);
      else
        *reinterpret_cast<__nv_bfloat162*>(at) = __floats2bfloat162_rn(s[nt][2 * half], s[nt][2 * half + 1]);
    });
  } else {
    for_each_state_pair(v0, g, t4, [&](int nt, int half, int v, int k) {
      char* at = staging + k * pitch + (v - v_block) * esize;
      if (is_f32) {
        *reinterpret_cast<float*>(at) = s[nt][2 * half];
        *reinterpret_cast<float*>(at + pitch) = s[nt][2 * half + 1];
      } else {
        *reinterpret_cast<__nv_bfloat16*>(at) = __float2bfloat16_rn(s[nt][2 * half]);
        *reinterpret_cast<__nv_bfloat16*>(at + pitch) = __float2bfloat16_rn(s[nt][2 * half + 1]);
      }
    });
  }
  // The generic-proxy writes above, visible to the bulk copies (async proxy) that read them.
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  consumer_barrier<NW>();
  if (tid < St::rows(k_first)) {
    const int64_t elem = base + St::row_destination(k_first, tid, v_block);
    cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared,
                             static_cast<char*>(states) + elem * esize, staging + tid * pitch,
                             static_cast<uint32_t>(St::row_bytes(k_first, esize)));
    cuda::ptx::cp_async_bulk_commit_group();
  }
}

/// Waits for this thread's state copies to complete (before the block exits: the staging
/// buffer must outlive them).
__device__ __forceinline__ void inter_store_drain() { cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{}); }

}  // namespace flash_kda::sm90
