#include "kernels/rope/rope.h"
#include "kernels/rope/rope_rotate.cuh"

namespace fusepack {

void run_rope_fwd(RopeFwdParams const& p, cudaStream_t stream) {
  RopeRotateArgs a;
  a.in = p.x;
  a.out = p.y;
  a.dims = p;
  launch_rope_rotate</*kInverse=*/false>(a, stream);
}

}  // namespace fusepack
