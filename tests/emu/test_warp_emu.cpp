// The CPU model of tests/emu/warp_emu.h on its own: shuffles move the values they should, each
// error the model promises to report fails run_grid with its message, and the stack holds what
// the model promises at the start of a block.
#include "warp_emu.h"

#include "sm90/common/ptx.cuh"  // tests/emu/shadow's st_global_v4

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using flash_kda::emu::run_grid;

/// The message run_grid throws for `body` on `grid` blocks of `threads`; empty when none.
std::string grid_error(unsigned threads, const std::function<void()>& body, unsigned grid = 1) {
  try {
    run_grid(dim3(grid), dim3(threads), 0, body);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

/// Whether `text` contains `part` (a failure prints both).
::testing::AssertionResult has(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

TEST(WarpEmu, ShufflesMoveLaneValues) {
  std::vector<int> xor_got(64), idx_got(64);
  EXPECT_EQ(grid_error(64, [&] {
              const int t = int(threadIdx.x);
              for (int off = 1; off <= 16; off *= 2) xor_got[size_t(t)] += __shfl_xor_sync(0xffffffffu, t, off);
              idx_got[size_t(t)] = __shfl_sync(0xffffffffu, 100 + t, 31 - t % 32);
            }),
            "");
  for (int t = 0; t < 64; ++t) {
    int want = 0;
    for (int off = 1; off <= 16; off *= 2) want += t ^ off;
    EXPECT_EQ(xor_got[size_t(t)], want) << "thread " << t;
    EXPECT_EQ(idx_got[size_t(t)], 100 + t / 32 * 32 + 31 - t % 32) << "thread " << t;
  }
}

TEST(WarpEmu, LanesAtDifferentShuffleSitesFail) {
  // The same shuffle on two lines, the lanes split by parity: on the GPU the result is
  // undefined (CUDA wants every lane of the mask at the same intrinsic).
  const std::string e = grid_error(32, [] {
    int x = int(threadIdx.x);
    if (threadIdx.x % 2)
      x = __shfl_xor_sync(0xffffffffu, x, 1);
    else
      x = __shfl_xor_sync(0xffffffffu, x, 1);
    (void)x;
  });
  EXPECT_TRUE(has(e, "lanes at different shuffle sites")) << e;
  EXPECT_TRUE(has(e, "test_warp_emu.cpp:")) << e;
}

TEST(WarpEmu, AnExceptionInAThreadFailsTheGrid) {
  const std::string e = grid_error(64, [] {
    if (threadIdx.x == 37) throw std::out_of_range("thread 37 gave up");
    __syncthreads();
  });
  EXPECT_TRUE(has(e, "thread 37 gave up"));
  EXPECT_TRUE(has(e, "thread (37, 0, 0)"));
  // The model runs the next grid as usual.
  std::vector<int> ran(32);
  EXPECT_EQ(grid_error(32, [&] {
              __syncthreads();
              ran[threadIdx.x] = 1;
            }),
            "");
  for (int r : ran) EXPECT_EQ(r, 1);
}

/// The number of bytes equal to 0xff in a 256-byte local array, after writing 0x5a to all of
/// them or (write false) without writing them: then it counts what the model left on the
/// stack (the volatile reads are not optimised away).
__attribute__((noinline)) int stack_bytes_ff(bool write) {
  volatile unsigned char buf[256];
  if (write)
    for (int i = 0; i < 256; ++i) buf[i] = 0x5a;
  int n = 0;
  for (int i = 0; i < 256; ++i) n += buf[i] == 0xff;
  return n;
}

TEST(WarpEmu, StacksStartEachBlockAsFillBytes) {
  // Block 0 writes the array, block 1 reads the same stack bytes (the same frame) unwritten:
  // refilled between the blocks, they hold 0xff again, not block 0's values.
  std::vector<int> ff(2, -1);
  EXPECT_EQ(grid_error(
                32,
                [&] {
                  const int n = stack_bytes_ff(blockIdx.x == 0);
                  if (threadIdx.x == 5) ff[blockIdx.x] = n;
                },
                2),
            "");
  EXPECT_EQ(ff[0], 0);
  EXPECT_EQ(ff[1], 256);
}

/// Recursion `depth` deep, 1 KB a frame.
__attribute__((noinline)) int recurse(int depth) {
  volatile char frame[1024];
  frame[0] = char(depth);
  return depth > 0 ? recurse(depth - 1) + frame[0] : frame[0];
}

TEST(WarpEmuDeathTest, StackOverflowFaultsAtTheGuard) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run_grid(dim3(1), dim3(1), 0, [] { recurse(1 << 20); }), "stack overflow of an emulated thread");
  // Within the stack: no fault.
  EXPECT_EQ(grid_error(1, [] { recurse(64); }), "");
}

TEST(WarpEmu, MisalignedGlobalAccessesFail) {
  alignas(16) unsigned char buf[64] = {};
  EXPECT_TRUE(has(grid_error(1, [&] { flash_kda::sm90::ptx::st_global_v4(buf + 8, make_uint4(1, 2, 3, 4)); }),
                  "st_global_v4 at an address not 16-byte aligned"));
  EXPECT_TRUE(has(grid_error(1, [&] { (void)__ldcg(reinterpret_cast<const uint4*>(buf + 4)); }),
                  "__ldcg at an address not 16-byte aligned"));
  EXPECT_TRUE(has(grid_error(1, [&] { (void)__ldcg(reinterpret_cast<const float*>(buf + 2)); }),
                  "__ldcg at an address not 4-byte aligned"));
  // Aligned, the bytes move.
  uint4 back{};
  EXPECT_EQ(grid_error(1, [&] {
              flash_kda::sm90::ptx::st_global_v4(buf + 16, make_uint4(1, 2, 3, 4));
              back = __ldcg(reinterpret_cast<const uint4*>(buf + 16));
            }),
            "");
  EXPECT_EQ(back.x, 1u);
  EXPECT_EQ(back.y, 2u);
  EXPECT_EQ(back.z, 3u);
  EXPECT_EQ(back.w, 4u);
}

TEST(WarpEmu, StaticSharedIsOneCopyPerBlockStartingAsNaN) {
  // Thread 0 writes, the others read after the barrier; every block first sees NaN.
  std::vector<float> seen(64, 0.f), before(2, 0.f);
  EXPECT_EQ(grid_error(
                32,
                [&] {
                  __shared__ float x[4];
                  if (threadIdx.x == 0) {
                    before[blockIdx.x] = x[3];
                    x[3] = float(blockIdx.x + 1);
                  }
                  __syncthreads();
                  seen[blockIdx.x * 32 + threadIdx.x] = x[3];
                },
                2),
            "");
  for (unsigned b = 0; b < 2; ++b) EXPECT_TRUE(std::isnan(before[b])) << "block " << b;
  for (int t = 0; t < 64; ++t) EXPECT_EQ(seen[size_t(t)], float(t / 32 + 1)) << "thread " << t;
}

TEST(WarpEmu, GatherGivesEveryLaneAllValues) {
  std::vector<int> sum(64, 0), last(64, 0);
  EXPECT_EQ(grid_error(64, [&] {
              const int mine[2] = {int(threadIdx.x), 1000};
              int all[32][2];
              flash_kda::emu::gather(mine, sizeof mine, all, {__FILE__, __LINE__});
              for (int l = 0; l < 32; ++l) sum[threadIdx.x] += all[l][0] + all[l][1];
              last[threadIdx.x] = all[31][0];
            }),
            "");
  for (int t = 0; t < 64; ++t) {
    const int base = t / 32 * 32;
    EXPECT_EQ(sum[size_t(t)], 32 * base + 31 * 32 / 2 + 32 * 1000) << "thread " << t;
    EXPECT_EQ(last[size_t(t)], base + 31) << "thread " << t;
  }
}

}  // namespace
