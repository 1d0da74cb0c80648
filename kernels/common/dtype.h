// The element types the kernels run in, as a plain enum for params structs (no torch, no CUDA headers here).
#pragma once

namespace fusepack {

enum class DType { kF32, kBF16, kF16 };

inline char const* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "?";
}

}  // namespace fusepack
