// The public GPU entry points: validate the whole call, then hand it to the launch logic.
#include "flash_kda/forward.h"
#if FLASH_KDA_WITH_CUDA
#include "sm90/launch.h"
#endif

namespace flash_kda {
namespace {

[[noreturn]] void no_cuda() {
  throw Error("device", "flash_kda was built without its CUDA kernels (FLASH_KDA_CUDA=OFF)");
}

}  // namespace

size_t forward_workspace_size(const ForwardArgs& args, const LaunchOptions& options) {
  const ProblemShape p = validate(args, Target::Sm90);
  (void)options;
#if FLASH_KDA_WITH_CUDA
  return sm90::workspace_bytes(p);
#else
  (void)p;
  no_cuda();
#endif
}

void forward(const ForwardArgs& args, void* workspace, size_t workspace_bytes, Stream stream,
             const LaunchOptions& options) {
  const ProblemShape p = validate(args, Target::Sm90);
  (void)options;
#if FLASH_KDA_WITH_CUDA
  sm90::launch_forward(args, p, workspace, workspace_bytes, stream);  // checks the workspace first
#else
  (void)p; (void)workspace; (void)workspace_bytes; (void)stream;
  no_cuda();
#endif
}

void forward(const ForwardArgs& args, const WorkspaceAllocator& allocate, Stream stream,
             const LaunchOptions& options) {
  const ProblemShape p = validate(args, Target::Sm90);
  (void)options;
#if FLASH_KDA_WITH_CUDA
  const size_t need = sm90::workspace_bytes(p);
  void* workspace = need > 0 ? allocate(need) : nullptr;
  sm90::launch_forward(args, p, workspace, need, stream);
#else
  (void)p; (void)allocate; (void)stream;
  no_cuda();
#endif
}

}  // namespace flash_kda
