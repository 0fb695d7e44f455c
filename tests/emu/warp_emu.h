// A CPU model of the CUDA execution the decode kernels rely on, so that their source (the very
// .cu file, compiled here as host C++) runs on a machine without a GPU: every thread of a block
// is a fiber; fibers run until they reach a warp shuffle, __syncwarp or __syncthreads, where
// they wait for the lanes (or threads) that take part, exchange values and go on. Blocks run one
// after another. What it models: thread and block indices, full-warp shuffles (xor and indexed,
// any 4- or 8-byte type), warp and block barriers, dynamic shared memory, the ld.global
// variants as plain loads, and the fast-math intrinsics as their libm forms.
// What it checks, failing the grid (run_grid throws) where the GPU's result would be undefined
// or the kernel would fault:
// - every lane of a warp reaches the same shuffle call site (the source line of the call) at
//   the same step; none waits at __syncwarp while others shuffle, none exits while others
//   wait at either;
// - a shuffle reads only from lanes the warp has; barriers complete (no deadlock);
// - 16-byte stores (ptx::st_global_v4) and __ldcg / __ldg / __stcg are aligned as the GPU
//   requires (16 bytes; alignof(T));
// - no write past the end of the dynamic shared memory (a 4 KB guard);
// - an exception thrown by the emulated code fails the grid with its message.
// What it shows through the tests' finite checks: shared memory starts as 0xff bytes (NaN as
// floats) and so does each thread's stack at the start of every block, so that a read before a
// write gives NaN rather than a stale or zero value. A stack overflow faults at an unmapped
// guard page below each stack and ends the process with a message.
// Static __shared__ variables are one process-wide copy each, refilled like the dynamic shared
// memory at every block's start.
// What it does not model: memory ordering, timing, partial-warp masks (a mask other than all
// lanes is an error), inline PTX (the kernels' ptx.cuh and launch_config.h are replaced by
// tests/emu/shadow).
// Include it before the kernel source; see tests/emu/test_decode_emu.cpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

namespace flash_kda::emu {

/// Where the running emulated thread is.
struct Coord {
  uint3 thread{}, block{};
  dim3 block_dim, grid_dim;
};

/// The running emulated thread's coordinates (only valid inside run_grid's body).
const Coord& coord();

/// The source location of a call into the model (a shuffle's call site). Every lane of a warp
/// must reach the same one: CUDA leaves a shuffle undefined unless all lanes of its mask
/// execute the same intrinsic, and lanes at different sites mean the warp has diverged.
struct Site {
  const char* file = "";
  int line = 0;
};

/// Shuffle: every lane of the warp posts `bits` and reads the bits of lane `src` (the caller's
/// lane index within 0..31), from the call at `site`. Blocks until every lane of the warp has
/// posted; fails the grid when the lanes posted from different sites.
uint64_t shuffle(uint64_t bits, int src, Site site);
/// All-gather within the warp, one warp-wide step with a shuffle's checks: every lane posts
/// `bytes` at `mine` and receives every lane's, in lane order, at `all` (lanes x bytes), from
/// the call at `site`. Stands in for exchanges the GPU does in hardware (a tensor-core mma's
/// fragments), which per-register shuffles would make ~200 times slower to model.
void gather(const void* mine, size_t bytes, void* all, Site site);
/// __syncwarp(): waits for every lane of the warp.
void sync_warp();
/// __syncthreads(): waits for every thread of the block that has not exited.
void sync_block();
/// The block's dynamic shared memory, 0xff bytes (NaN as floats) at the block's start, as are
/// the 4 KB past its end; a write there fails run_grid.
char* dynamic_smem();

/// Runs `body` once per thread of each block of `grid` x `block`, one block after another, with
/// `smem_bytes` of dynamic shared memory per block. Throws std::runtime_error with the first
/// error of the emulated code: threads deadlock (a barrier some lanes never reach), lanes of a
/// warp at different shuffle sites or steps, a shuffle mask that is not all lanes, a lane of a
/// partial warp reading from a lane that does not exist, a misaligned access (fail), a write
/// past the shared memory, or an exception thrown by `body`. Not reentrant: `body` must not
/// call run_grid.
void run_grid(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body);

/// Records an error of the emulated code (with the thread and block that hit it) and ends the
/// grid (run_grid throws it). Only inside run_grid's body.
[[noreturn]] void fail(const std::string& what);

/// Fails the grid unless `p` is a multiple of `alignment` bytes; `what` names the access.
inline void check_aligned(const void* p, size_t alignment, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0)
    fail(std::string(what) + " at an address not " + std::to_string(alignment) + "-byte aligned");
}

template <class T>
T shuffle_value(unsigned mask, T v, int src, Site site) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
  if (mask != 0xffffffffu) fail("shuffle with a partial mask");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = shuffle(bits, src, site);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

}  // namespace flash_kda::emu

// The CUDA spellings the kernels use, on the model above. The qualifiers become plain C++.
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
// A static __shared__ variable: one copy for the process (blocks run one after another), in a
// section of its own that run_grid fills with 0xff bytes (NaN as floats) at every block's start.
#undef __shared__
#define __shared__ static __attribute__((section("flash_kda_emu_shared")))
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef threadIdx
#define threadIdx (::flash_kda::emu::coord().thread)
#undef blockIdx
#define blockIdx (::flash_kda::emu::coord().block)
#undef blockDim
#define blockDim (::flash_kda::emu::coord().block_dim)
#undef gridDim
#define gridDim (::flash_kda::emu::coord().grid_dim)

// The shuffles take their call site as defaulted arguments (__builtin_FILE / __builtin_LINE
// are evaluated where the call is written), which holds whatever the optimiser inlines or
// duplicates; a return address would name the caller of an inlined shuffle instead.
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  const int lane = int(threadIdx.x) % 32;
  const int src = (lane ^ lane_mask) < ((lane / width) + 1) * width ? (lane ^ lane_mask) : lane;
  return ::flash_kda::emu::shuffle_value(mask, v, src, {file, line});
}
template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  const int lane = int(threadIdx.x) % 32;
  return ::flash_kda::emu::shuffle_value(mask, v, (lane / width) * width + src_lane % width, {file, line});
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) ::flash_kda::emu::fail("__syncwarp with a partial mask");
  ::flash_kda::emu::sync_warp();
}
inline void __syncthreads() { ::flash_kda::emu::sync_block(); }

inline float __uint_as_float(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline uint32_t __float_as_uint(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}
inline float __int_as_float(int x) { return __uint_as_float(uint32_t(x)); }
inline int __float_as_int(float f) { return int(__float_as_uint(f)); }
// Global loads and stores as plain ones, at the alignment the GPU requires of them (a
// misaligned access faults there).
template <class T>
T __ldcg(const T* p) {
  ::flash_kda::emu::check_aligned(p, alignof(T), "__ldcg");
  return *p;
}
template <class T>
T __ldg(const T* p) {
  ::flash_kda::emu::check_aligned(p, alignof(T), "__ldg");
  return *p;
}
template <class T>
void __stcg(T* p, T v) {
  ::flash_kda::emu::check_aligned(p, alignof(T), "__stcg");
  *p = v;
}
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
