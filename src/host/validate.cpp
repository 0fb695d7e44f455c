// Validation of a whole forward call. (stub: to be written)
#include <cmath>

#include "flash_kda/forward.h"

namespace flash_kda {

ProblemShape validate(const ForwardArgs& args, Target target) {
  (void)target;
  ProblemShape p;
  p.batch = args.q.shape[0];
  p.seqlen = args.q.shape[1];
  p.heads = args.q.shape[2];
  p.head_dim_k = args.q.shape[3];
  p.value_heads = args.v.shape[2];
  p.head_dim_v = args.v.shape[3];
  p.varlen = args.cu_seqlens.defined();
  p.num_seqs = p.varlen ? args.cu_seqlens.shape[0] - 1 : p.batch;
  p.scale = args.scale ? *args.scale : 1.0 / std::sqrt(double(p.head_dim_k));
  return p;
}

}  // namespace flash_kda
