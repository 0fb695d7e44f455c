// The CPU model of tests/emu/warp_emu.h on its own: shuffles move the values they should, and
// each error the model promises to report fails run_grid with its message.
#include "warp_emu.h"

#include "sm90/common/ptx.cuh"  // tests/emu/shadow's st_global_v4

#include <gtest/gtest.h>

#include <cstring>
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

}  // namespace
