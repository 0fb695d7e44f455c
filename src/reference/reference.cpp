// CPU fp64 reference of KDA. (stub: to be written)
#include "flash_kda/forward.h"

namespace flash_kda {

void reference_forward(const ForwardArgs& args, int num_threads) {
  (void)args; (void)num_threads;
  throw Error("reference", "not implemented yet");
}

}  // namespace flash_kda
