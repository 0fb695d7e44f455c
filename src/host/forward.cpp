// The public GPU entry points: validate the whole call and its launch options once, then hand
// it to the sm_90a launch (which plans once and launches).
#include "flash_kda/forward.h"
#if FLASH_KDA_WITH_CUDA
#include "sm90/forward/launch.h"
#include "sm90/forward/plan.h"
#endif

namespace flash_kda {
// validate(args, Sm90) and the options that need no device; in a build without the kernels,
// the Error saying so (after the arguments' own errors).
ProblemShape validate_forward(const ForwardArgs& args, const LaunchOptions& options) {
  const ProblemShape p = validate(args, Target::Sm90);
#if FLASH_KDA_WITH_CUDA
  sm90::validate_options(options);
  return p;
#else
  (void)p; (void)options;
  throw Error("device", "flash_kda was built without its CUDA kernels (FLASH_KDA_CUDA=OFF)");
#endif
}

size_t forward_workspace_size(const ForwardArgs& args, const LaunchOptions& options) {
  const ProblemShape p = validate_forward(args, options);
#if FLASH_KDA_WITH_CUDA
  return sm90::workspace_bytes(p, options);
#else
  (void)p;
  return 0;
#endif
}

void forward(const ForwardArgs& args, void* workspace, size_t workspace_bytes, Stream stream,
             const LaunchOptions& options) {
  const ProblemShape p = validate_forward(args, options);
#if FLASH_KDA_WITH_CUDA
  sm90::launch_forward(args, p, options, workspace, workspace_bytes, nullptr, stream);  // checks the workspace first
#else
  (void)p; (void)workspace; (void)workspace_bytes; (void)stream;
#endif
}

void forward(const ForwardArgs& args, const WorkspaceAllocator& allocate, Stream stream,
             const LaunchOptions& options) {
  const ProblemShape p = validate_forward(args, options);
#if FLASH_KDA_WITH_CUDA
  sm90::launch_forward(args, p, options, nullptr, 0, &allocate, stream);
#else
  (void)p; (void)allocate; (void)stream;
#endif
}

}  // namespace flash_kda
