// The one exception type the flash_kda API throws for bad input.
#pragma once

#include <stdexcept>
#include <string>

namespace flash_kda {

/// Thrown when a call's arguments are invalid or unsupported, before any kernel runs and
/// before anything is written. `what()` reads "flash_kda: <argument>: <what was expected>";
/// `argument()` is the offending argument's name as in the API (e.g. "cu_seqlens").
class Error : public std::invalid_argument {
 public:
  Error(std::string argument, const std::string& expected)
      : std::invalid_argument("flash_kda: " + argument + ": " + expected),
        argument_(std::move(argument)) {}
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

/// Thrown when the CUDA runtime reports a failure (launch or attribute call).
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace flash_kda
