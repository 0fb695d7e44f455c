// Lookups and message fragments over the call table (include/flash_kda/call_table.h).
#include "flash_kda/call_table.h"

#include <stdexcept>

namespace flash_kda {

std::string dtype_list(DTypeSet set) {
  std::string names[8];
  int n = 0;
  for (int d = 0; d < 8 && n < 8; ++d)
    if (set & (DTypeSet{1} << d)) names[n++] = dtype_name(static_cast<DType>(d));
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i) s += (i + 1 == n) ? " or " : ", ";
    s += names[i];
  }
  return s;
}

std::string expected_rank(const TensorSpec& spec) {
  if (spec.rank == 0) return std::string("expected shape ") + spec.shape;
  return "expected rank " + std::to_string(spec.rank) + " " + spec.shape;
}

}  // namespace flash_kda
