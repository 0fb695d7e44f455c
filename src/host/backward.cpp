// The public backward entry points (include/flash_kda/backward.h): validate the whole call
// once, then hand it to the sm_90a launch.
#include "flash_kda/backward.h"
#include "host/backward_checks.h"
#if FLASH_KDA_WITH_CUDA
#include "sm90/backward/launch.h"
#endif

namespace flash_kda {

ProblemShape validate_backward(const BackwardArgs& args) {
  const ProblemShape p = detail::check_backward(args, Target::Sm90);
#if FLASH_KDA_WITH_CUDA
  return p;
#else
  (void)p;
  throw Error("device", "flash_kda was built without its CUDA kernels (FLASH_KDA_CUDA=OFF)");
#endif
}

size_t backward_workspace_size(const BackwardArgs& args) {
  const ProblemShape p = validate_backward(args);
#if FLASH_KDA_WITH_CUDA
  return sm90::backward_workspace_bytes(p);
#else
  (void)p;
  return 0;
#endif
}

void backward(const BackwardArgs& args, void* workspace, size_t workspace_bytes, Stream stream) {
  const ProblemShape p = validate_backward(args);
#if FLASH_KDA_WITH_CUDA
  sm90::launch_backward(args, p, workspace, workspace_bytes, nullptr, stream);
#else
  (void)p; (void)workspace; (void)workspace_bytes; (void)stream;
#endif
}

void backward(const BackwardArgs& args, const WorkspaceAllocator& allocate, Stream stream) {
  const ProblemShape p = validate_backward(args);
#if FLASH_KDA_WITH_CUDA
  sm90::launch_backward(args, p, nullptr, 0, &allocate, stream);
#else
  (void)p; (void)allocate; (void)stream;
#endif
}

}  // namespace flash_kda
