// Run-time value → compile-time constant, in one place per op's launcher (FlashAttention's static_switch.h idea).
//   FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] { launch<T>(p, stream); });
//   FUSEPACK_BOOL_SWITCH(p.silu, kSilu, [&] { launch<kSilu>(p, stream); });
//   FUSEPACK_INT_SWITCH(HeadDims, p.K, kK, [&] { launch<kK>(p, stream); });  // HeadDims = IntList<64, 128>
// An IntList is the whole statement of which values a kernel is compiled for: the switch instantiates exactly its
// entries, and validation and refusal messages read the same list (contains, str). The integer switches are plain
// C++, so the LibTorch layer checks against the lists on builds without CUDA as well.
#pragma once

#include "kernels/common/dtype.h"

// The dtype switch names CUDA's 16-bit types; their headers come along in CUDA translation units only.
#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

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

// LIST (an IntList type) → compile-time constant NAME, one of LIST's values; std::invalid_argument naming the value
// and the list otherwise (the ops layer refuses unsupported values first, with its own message from the same list).
#define FUSEPACK_INT_SWITCH(LIST, VAL, NAME, ...)                                                   \
  ::fusepack::static_switch_detail::int_switch(LIST{}, (VAL), #NAME, [&](auto fusepack_int_value) { \
    constexpr static int NAME = decltype(fusepack_int_value)::value;                                \
    return __VA_ARGS__();                                                                           \
  })

namespace fusepack {

// The values an integer switch covers, in order.
template <int... kValues>
struct IntList {
  static constexpr bool contains(std::int64_t value) { return ((value == kValues) || ...); }
  static std::string str() {  // "{64, 128}"
    std::string s;
    ((s += (s.empty() ? "{" : ", ") + std::to_string(kValues)), ...);
    return s + "}";
  }
  static std::string range_str() {  // "2..4" for consecutive ascending values (IntList<2, 3, 4>), str() otherwise
    constexpr int values[] = {kValues...};
    constexpr int n = sizeof...(kValues);
    for (int i = 1; i < n; ++i) {
      if (values[i] != values[0] + i) return str();
    }
    return n > 1 ? std::to_string(values[0]) + ".." + std::to_string(values[n - 1]) : str();
  }
};

namespace static_switch_detail {

template <class List, int kFirst, int... kRest, class Body>
auto int_switch_from(IntList<kFirst, kRest...>, int value, char const* name, Body const& body) {
  if (value == kFirst) return body(std::integral_constant<int, kFirst>{});
  if constexpr (sizeof...(kRest) > 0) {
    return int_switch_from<List>(IntList<kRest...>{}, value, name, body);
  } else {
    throw std::invalid_argument(std::string("unsupported ") + name + "=" + std::to_string(value) + ": compiled for " +
                                List::str());
  }
}

template <int... kValues, class Body>
auto int_switch(IntList<kValues...> list, int value, char const* name, Body const& body) {
  return int_switch_from<IntList<kValues...>>(list, value, name, body);
}

}  // namespace static_switch_detail

}  // namespace fusepack
