#pragma once

namespace flash_kda {
/// Library version, "major.minor.patch" (the Python package reports the same string).
inline constexpr const char* kVersion = "0.1.0";
}  // namespace flash_kda
