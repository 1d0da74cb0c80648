#include "kernels/rope/rope.h"
#include "kernels/rope/rope_rotate.cuh"

namespace fusepack {

// y = R(a)·x per channel pair with R orthogonal, so dx = R(a)ᵀ·dy = R(−a)·dy: the forward kernel with sin negated.
// Each output element is written by one thread from its own inputs: bitwise deterministic.
void run_rope_bwd(RopeBwdParams const& p, cudaStream_t stream) {
  RopeRotateArgs a;
  a.in = p.dy;
  a.out = p.dx;
  a.dims = p;
  launch_rope_rotate</*kInverse=*/true>(a, stream);
}

}  // namespace fusepack
