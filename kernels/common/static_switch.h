// Run-time value → compile-time constant, in one place per op's launcher (FlashAttention's static_switch.h idea).
//   FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] { launch<T>(p, stream); });
//   FUSEPACK_BOOL_SWITCH(p.silu, kSilu, [&] { launch<kSilu>(p, stream); });
#pragma once

#include "kernels/common/dtype.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#define FUSEPACK_BOOL_SWITCH(cond, NAME, ...) \
  [&] {                                       \
    if (cond) {                               \
      constexpr static bool NAME = true;      \
      return __VA_ARGS__();                   \
    } else {                                  \
      constexpr static bool NAME = false;     \
      return __VA_ARGS__();                   \
    }                                         \
  }()

#define FUSEPACK_DTYPE_SWITCH(dtype, TYPE, ...)                                                        \
  [&] {                                                                                                \
    switch (dtype) {                                                                                   \
      case ::fusepack::DType::kF32: {                                                                  \
        using TYPE = float;                                                                            \
        return __VA_ARGS__();                                                                          \
      }                                                                                                \
      case ::fusepack::DType::kBF16: {                                                                 \
        using TYPE = __nv_bfloat16;                                                                    \
        return __VA_ARGS__();                                                                          \
      }                                                                                                \
      case ::fusepack::DType::kF16: {                                                                  \
        using TYPE = __half;                                                                           \
        return __VA_ARGS__();                                                                          \
      }                                                                                                \
    }                                                                                                  \
    throw std::invalid_argument("unsupported dtype " + std::to_string(static_cast<int>(dtype)));       \
  }()
