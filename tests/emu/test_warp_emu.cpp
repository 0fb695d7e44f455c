// The CPU model of tests/emu/warp_emu.h on its own: each error the model promises to report
// fails run_grid with its message.
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
