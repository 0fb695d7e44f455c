// The warp-level tf32 tensor-core product of the chunk-gradient kernel (chunk_grad.cu):
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 with fp32 accumulation, behind a small
// "warp" interface so that the CPU test (tests/cpp/test_backward_mma_tiles.cpp) runs the very
// same tiled loops (chunk_grad_products.cuh) with an emulated warp.
//
// Fragment layout (PTX ISA, "Matrix fragments for mma.m16n8k8", .tf32), lane = threadIdx.x % 32,
// g = lane / 4, t = lane % 4:
//   A (16 x 8, row-major): a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4]
//   B (8 x 8, K x N):      b0 = B[t][g], b1 = B[t+4][g]
//   C, D (16 x 8):         c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
#pragma once

#include <cstdint>

#include "common/gate.h"
// DeviceWarp is device code, and also the CPU model's (tests/emu, FLASH_KDA_EMU: the kernel
// compiled as host C++, with ptx.cuh's host stand-in emulating the warp's mma).
#if defined(__CUDACC__) || defined(FLASH_KDA_EMU)
#define FKDA_BWD_DEVICE_WARP 1
#include "sm90/common/ptx.cuh"
#endif

namespace flash_kda::sm90::bwd {

/// Row of A-fragment register r (0..3) of `lane`.
FKDA_HOST_DEVICE int frag_a_row(int lane, int r) { return (lane >> 2) + 8 * (r & 1); }
/// Column (k) of A-fragment register r of `lane`.
FKDA_HOST_DEVICE int frag_a_col(int lane, int r) { return (lane & 3) + 4 * (r >> 1); }
/// Row (k) of B-fragment register r (0..1) of `lane`.
FKDA_HOST_DEVICE int frag_b_row(int lane, int r) { return (lane & 3) + 4 * r; }
/// Column (n) of B-fragment registers of `lane`.
FKDA_HOST_DEVICE int frag_b_col(int lane) { return lane >> 2; }
/// Row of accumulator register r (0..3) of `lane`.
FKDA_HOST_DEVICE int frag_c_row(int lane, int r) { return (lane >> 2) + 8 * (r >> 1); }
/// Column of accumulator register r of `lane`.
FKDA_HOST_DEVICE int frag_c_col(int lane, int r) { return 2 * (lane & 3) + (r & 1); }

/// One lane's operand and accumulator registers (fp32 values; rounded to tf32 at the mma).
struct FragA {
  float x[4];
};
struct FragB {
  float x[2];
};
struct FragC {
  float x[4];
};

/// An accumulator tile (16 x 8) as the A operand (16 x 8) of a further product, with no data
/// movement: the lane's c0, c1, c2, c3 (rows g, g + 8; columns 2t, 2t + 1) become a0, a2, a1,
/// a3 (rows g, g + 8; k = t, t + 4), so A's k is the accumulator's column kperm(k). A sum over
/// k is a sum over the columns in that order: the B operand's k rows are read permuted alike.
FKDA_HOST_DEVICE FragA frag_a_of_c(const FragC& c) { return FragA{{c.x[0], c.x[2], c.x[1], c.x[3]}}; }
/// The accumulator column that A's k (0..7) is in frag_a_of_c.
FKDA_HOST_DEVICE int frag_kperm(int k) { return k < 4 ? 2 * k : 2 * (k - 4) + 1; }

#if defined(FKDA_BWD_DEVICE_WARP)

/// The warp of the calling thread: fragments are this lane's registers.
struct DeviceWarp {
  using A = FragA;
  using B = FragB;
  using C = FragC;

  /// This lane's A fragment of the 16 x 8 tile whose element (row, k) is at(row, k).
  template <class F>
  __device__ __forceinline__ A load_a(F at) const {
    const int lane = int(threadIdx.x & 31);
    A f;
#pragma unroll
    for (int r = 0; r < 4; ++r) f.x[r] = at(frag_a_row(lane, r), frag_a_col(lane, r));
    return f;
  }
  /// This lane's B fragment of the 8 x 8 tile whose element (k, n) is at(k, n).
  template <class F>
  __device__ __forceinline__ B load_b(F at) const {
    const int lane = int(threadIdx.x & 31);
    B f;
#pragma unroll
    for (int r = 0; r < 2; ++r) f.x[r] = at(frag_b_row(lane, r), frag_b_col(lane));
    return f;
  }
  /// c += x, lane by lane.
  __device__ __forceinline__ void add(C& c, const C& x) const {
#pragma unroll
    for (int r = 0; r < 4; ++r) c.x[r] += x.x[r];
  }
  /// This lane's A fragment stored as 4 consecutive floats a lane (f 16-byte aligned: 128
  /// floats a fragment, lane l's at f + 4 l).
  __device__ __forceinline__ A load_a_packed(const float* f) const {
    const float4 x = *reinterpret_cast<const float4*>(f + 4 * int(threadIdx.x & 31));
    return A{{x.x, x.y, x.z, x.w}};
  }
  /// The accumulator tile c as an A operand (frag_a_of_c).
  __device__ __forceinline__ A a_of_c(const C& c) const { return frag_a_of_c(c); }
  /// c += x where `on`, else c unchanged.
  __device__ __forceinline__ void add_c_if(C& c, const C& x, bool on) const {
#pragma unroll
    for (int r = 0; r < 4; ++r) c.x[r] += on ? x.x[r] : 0.f;
  }
  /// c += a b with a and b rounded to tf32.
  __device__ __forceinline__ void mma(C& c, const A& a, const B& b) const {
    const uint32_t ua[4] = {ptx::tf32(a.x[0]), ptx::tf32(a.x[1]), ptx::tf32(a.x[2]), ptx::tf32(a.x[3])};
    const uint32_t ub[2] = {ptx::tf32(b.x[0]), ptx::tf32(b.x[1])};
    ptx::mma_tf32(c.x, ua, ub);
  }
  /// c += a b to about fp32 accuracy (3xTF32): each operand split into a tf32 head and a tf32
  /// tail, c += a_tail b_head + a_head b_tail + a_head b_head (the tail product is below fp32's
  /// rounding and is dropped).
  __device__ __forceinline__ void mma_split(C& c, const A& a, const B& b) const {
    uint32_t ah[4], al[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      ah[r] = ptx::tf32(a.x[r]);
      al[r] = ptx::tf32(a.x[r] - __uint_as_float(ah[r] & 0xffffe000u));  // tf32() leaves the low bits open
    }
    mma_split_b(c, ah, al, b);
  }
  /// An operand as its tf32 head and tail (3xTF32), split once for an operand that meets
  /// several others (mma_split on split operands). The split truncates: head = x with its low 13
  /// bits cleared, tail = x - head (exact in fp32) with its low 13 bits cleared, both exact tf32
  /// numbers, so the mma reads them as they are. Three integer and float operations an element
  /// against four with two conversions (cvt.rn.tf32, a slower pipe) for a rounded split. Each
  /// operand keeps 2^-20 of itself; a product, without its tail x tail term, keeps about 2^-19
  /// of itself (rounded split: 2^-21), its error pulling it toward zero by ~3e-7 on average.
  /// That error is proportional to each product, so a sum of products that cancel keeps it
  /// relative to the sum: far below the 1e-5 the gradients need (test_backward_mma_tiles.cpp).
  struct SplitA {
    uint32_t hi[4], lo[4];
  };
  struct SplitB {
    uint32_t hi[2], lo[2];
  };
  __device__ __forceinline__ static void split_trunc(float x, uint32_t& hi, uint32_t& lo) {
    hi = __float_as_uint(x) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
  }
  __device__ __forceinline__ SplitA split(const A& a) const {
    SplitA s;
#pragma unroll
    for (int r = 0; r < 4; ++r) split_trunc(a.x[r], s.hi[r], s.lo[r]);
    return s;
  }
  __device__ __forceinline__ SplitB split(const B& b) const {
    SplitB s;
#pragma unroll
    for (int r = 0; r < 2; ++r) split_trunc(b.x[r], s.hi[r], s.lo[r]);
    return s;
  }
  /// c += a b to about fp32 accuracy from split operands: the three products of mma_split.
  __device__ __forceinline__ void mma_split(C& c, const SplitA& a, const SplitB& b) const {
    ptx::mma_tf32(c.x, a.lo, b.hi);
    ptx::mma_tf32(c.x, a.hi, b.lo);
    ptx::mma_tf32(c.x, a.hi, b.hi);
  }
  /// mma_split with A already split (tf32_split: hi and lo exact tf32 numbers), for an operand
  /// that several warps read: split once where it is written rather than by every reader.
  __device__ __forceinline__ void mma_split_a(C& c, const A& hi, const A& lo, const B& b) const {
    uint32_t ah[4], al[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      ah[r] = __float_as_uint(hi.x[r]);
      al[r] = __float_as_uint(lo.x[r]);
    }
    mma_split_b(c, ah, al, b);
  }

 private:
  /// The 3xTF32 products of a split A (head ah, tail al) and b, split here.
  __device__ __forceinline__ static void mma_split_b(C& c, const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                                     const B& b) {
    uint32_t bh[2], bl[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      bh[r] = ptx::tf32(b.x[r]);
      bl[r] = ptx::tf32(b.x[r] - __uint_as_float(bh[r] & 0xffffe000u));
    }
    ptx::mma_tf32(c.x, al, bh);
    ptx::mma_tf32(c.x, ah, bl);
    ptx::mma_tf32(c.x, ah, bh);
  }
};

/// x as a tf32 head and tail, both exact tf32 numbers (low 13 bits zero): hi + lo is x to
/// about 2^-22 of x, the split mma_split makes.
__device__ __forceinline__ void tf32_split(float x, float& hi, float& lo) {
  hi = __uint_as_float(ptx::tf32(x) & 0xffffe000u);
  lo = __uint_as_float(ptx::tf32(x - hi) & 0xffffe000u);
}

#endif  // FKDA_BWD_DEVICE_WARP

}  // namespace flash_kda::sm90::bwd
