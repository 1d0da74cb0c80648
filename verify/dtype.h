// Floating-point formats the kernels run in, as seen from fp64: rounding a value to a format (so the reference sees
// exactly the bits a kernel saw) and the spacing of a format at a magnitude (the "one rounding step" floor of the
// docs/contracts.md, numerics rule).
#pragma once

#include "reference/tensor.h"

#include <string>

namespace fusepack::verify {

enum class Dtype { kF64, kF32, kF16, kBF16 };

char const* dtype_name(Dtype dtype);  // "fp64", "fp32", "fp16", "bf16"
int mantissa_bits(Dtype dtype);       // explicit fraction bits: 52, 23, 10, 7

// Round to nearest, ties to even, as a cast to that format would (fp16 overflow gives inf, its subnormals kept).
double round_to(Dtype dtype, double x);
void round_to(Dtype dtype, ref::Tensor& t);

// Distance between adjacent values of `dtype` at `magnitude` (its ulp there); for magnitude 0, at 1.
double rounding_step(Dtype dtype, double magnitude);

}  // namespace fusepack::verify
