// The mbarrier stage ring of the sm_90a kernels: a ring of shared-memory stage buffers, each
// with a `full` barrier (its copies landed) and an `empty` barrier (its readers are done), and
// the one bulk copy that moves a chunk record into a stage.
//
// Parity bookkeeping: the k-th use (k = 0, 1, ...) of buffer b is the k-th phase of full[b]
// and of empty[b]. A waiter on phase k waits for parity k % 2. A producer refilling buffer b for
// its k-th use waits for empty[b]'s phase k - 1, parity (k + 1) % 2: a fresh barrier counts its
// phase "-1" (parity 1) as completed, so the first round does not wait. RingPos walks the
// buffers in order and flips the parity at each wrap.
#pragma once

#include <cstdint>

#include <cuda/ptx>

#include "sm90/common/record.h"

namespace flash_kda::sm90 {

/// Spins until the phase of `bar` with parity `parity` has completed.
__device__ __forceinline__ void wait_phase(uint64_t* bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

/// A position in a ring of kStages buffers: the buffer and the parity of its current phase.
template <int kStages>
struct RingPos {
  int buf;
  uint32_t parity;
  __device__ __forceinline__ void advance() {
    if (++buf == kStages) buf = 0, parity ^= 1u;
  }
};

/// One chunk record, byte for byte, from global memory into a stage buffer: one bulk copy
/// (cp.async.bulk: the TMA engine, one instruction) issued by one thread, which also sets
/// `full`'s transaction count. `dst` and `rec` are 16-byte aligned.
__device__ __forceinline__ void copy_record(char* dst, uint64_t* full, const char* rec) {
  namespace ptx = cuda::ptx;
  ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full, kRecordBytes);
  ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, dst, rec, kRecordBytes, full);
}

}  // namespace flash_kda::sm90
