// tests/emu's stand-in for src/sm90/common/dynamic_smem.cuh: the running block's dynamic shared
// memory of the CPU model (warp_emu.h).
#pragma once

#include "warp_emu.h"

namespace flash_kda::sm90 {

inline char* dynamic_smem() { return ::flash_kda::emu::dynamic_smem(); }

}  // namespace flash_kda::sm90
