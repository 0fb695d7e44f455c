// The public GPU entry point: validate the whole call, then hand it to the launch logic.
#include "flash_kda/forward.h"
#if FLASH_KDA_WITH_CUDA
#include "sm90/launch.h"
#endif

namespace flash_kda {

size_t forward_workspace_size(const ForwardArgs& args) {
  const ProblemShape p = validate(args, Target::Sm90);
#if FLASH_KDA_WITH_CUDA
  return sm90::workspace_bytes(p);
#else
  (void)p;
  throw Error("device", "flash_kda was built without its CUDA kernels (FLASH_KDA_CUDA=OFF)");
#endif
}

void forward(const ForwardArgs& args, void* workspace, size_t workspace_bytes, Stream stream) {
  const ProblemShape p = validate(args, Target::Sm90);
#if FLASH_KDA_WITH_CUDA
  sm90::launch_forward(args, p, workspace, workspace_bytes, stream);  // checks the workspace first
#else
  (void)p; (void)workspace; (void)workspace_bytes; (void)stream;
  throw Error("device", "flash_kda was built without its CUDA kernels (FLASH_KDA_CUDA=OFF)");
#endif
}

}  // namespace flash_kda
