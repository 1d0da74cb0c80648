#include "verify/dtype.h"

#include <cmath>
#include <limits>

namespace fusepack::verify {

char const* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF64: return "fp64";
    case Dtype::kF32: return "fp32";
    case Dtype::kF16: return "fp16";
    case Dtype::kBF16: return "bf16";
  }
  return "?";
}

int mantissa_bits(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF64: return 52;
    case Dtype::kF32: return 23;
    case Dtype::kF16: return 10;
    case Dtype::kBF16: return 7;
  }
  return 52;
}

static int min_normal_exponent(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF64: return -1022;
    case Dtype::kF32:
    case Dtype::kBF16: return -126;
    case Dtype::kF16: return -14;
  }
  return -1022;
}

double round_to(Dtype dtype, double x) {
  if (dtype == Dtype::kF64 || x == 0 || !std::isfinite(x)) return x;
  if (dtype == Dtype::kF32) return static_cast<double>(static_cast<float>(x));
  int const e = std::max(std::ilogb(x), min_normal_exponent(dtype));
  double const step = std::ldexp(1.0, e - mantissa_bits(dtype));
  double const r = std::nearbyint(x / step) * step;  // default rounding mode: to nearest, ties to even
  double const max_finite = dtype == Dtype::kF16 ? 65504.0 : static_cast<double>(std::numeric_limits<float>::max());
  if (std::fabs(r) > max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

void round_to(Dtype dtype, ref::Tensor& t) {
  for (ref::Index i = 0; i < t.numel(); ++i) t.data()[i] = round_to(dtype, t.data()[i]);
}

double rounding_step(Dtype dtype, double magnitude) {
  double const m = std::fabs(magnitude);
  int const e = (m > 0 && std::isfinite(m)) ? std::max(std::ilogb(m), min_normal_exponent(dtype)) : 0;
  return std::ldexp(1.0, e - mantissa_bits(dtype));
}

}  // namespace fusepack::verify
