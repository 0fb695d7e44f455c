#include <gtest/gtest.h>

#include "flash_kda/flash_kda.h"

TEST(Tensor, DtypeSizes) {
  EXPECT_EQ(flash_kda::dtype_size(flash_kda::DType::BF16), 2);
  EXPECT_EQ(flash_kda::dtype_size(flash_kda::DType::F64), 8);
}
