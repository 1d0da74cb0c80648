// Element j of a parameter's initial value as a pure function of (key, j, rule): Philox4x32-10 keyed by a hash of
// (seed, parameter name) with counter j, then Box–Muller or log-uniform in double. The CPU loop (init.cpp) and the CUDA
// kernel (init_rows.cu) both call init_element, so they cannot drift apart. No torch, no CUDA headers.
//
// Numerical contract: CPU and CUDA give the same double, bit for bit, hence the same value in every dtype. That holds
// because only operations IEEE 754 rounds correctly on both sides are used: integer math, +, −, ×, ÷, sqrt and explicit
// fma. log and cos are written out below instead of taken from libm: glibc and CUDA's libdevice differ in the last bit
// of a double now and then, which after rounding to fp32 or bf16 would still show whenever a value lands next to a
// rounding midpoint. Every multiply–add is an explicit fma and the one product feeding a plain addition is an exact
// halving, so a compiler's fma contraction has nothing to change; fast-math (reassociation) would break the contract.
#pragma once

#include "trainer/model/parameters.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__CUDACC__)
#define FUSEPACK_INIT_HD __host__ __device__
#else
#define FUSEPACK_INIT_HD
#endif

namespace fusepack::model::init_math {

// ---- the generator ------------------------------------------------------------------------------------------------

// Steele, Lea and Flood's splitmix64 finalizer: every input bit reaches every output bit.
FUSEPACK_INIT_HD constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The Philox key of one parameter. FNV-1a alone barely separates "layers.0" from "layers.1"; the splitmix64 around it
// spreads one changed byte over all 64 bits.
inline std::uint64_t parameter_key(std::uint64_t seed, std::string_view name) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  return splitmix64(splitmix64(seed) ^ h);
}

// Philox4x32-10 (Salmon et al., SC'11; the generator of cuRAND and of PyTorch's CUDA RNG): a keyed bijection of a
// 128-bit counter. Checked against Random123's known-answer vectors in tests/trainer/init_test.cpp.
struct Philox4x32 {
  std::uint32_t v[4];
};

FUSEPACK_INIT_HD inline Philox4x32 philox4x32_10(Philox4x32 ctr, std::uint32_t k0, std::uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    std::uint64_t const p0 = std::uint64_t{0xD2511F53u} * ctr.v[0];
    std::uint64_t const p1 = std::uint64_t{0xCD9E8D57u} * ctr.v[2];
    ctr = Philox4x32{{static_cast<std::uint32_t>(p1 >> 32) ^ ctr.v[1] ^ k0, static_cast<std::uint32_t>(p1),
                      static_cast<std::uint32_t>(p0 >> 32) ^ ctr.v[3] ^ k1, static_cast<std::uint32_t>(p0)}};
  }
  return ctr;
}

// ---- correctly rounded primitives, spelled out on the device so nothing else can be substituted ------------------

FUSEPACK_INIT_HD inline double fma_rn(double a, double b, double c) {
#ifdef __CUDA_ARCH__
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
FUSEPACK_INIT_HD inline double mul_rn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
FUSEPACK_INIT_HD inline double div_rn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
FUSEPACK_INIT_HD inline double sqrt_rn(double a) {
#ifdef __CUDA_ARCH__
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
// The bits of a value as another type of the same size (std::bit_cast, which C++17 lacks).
template <typename To, typename From>
FUSEPACK_INIT_HD inline To bit_cast(From x) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
  To y;
  std::memcpy(&y, &x, sizeof y);
  return y;
}
FUSEPACK_INIT_HD inline std::uint64_t bits_of(double x) { return bit_cast<std::uint64_t>(x); }
FUSEPACK_INIT_HD inline std::uint32_t bits_of(float x) { return bit_cast<std::uint32_t>(x); }

// ---- log and cos from those primitives ----------------------------------------------------------------------------

// ln x for a positive normal double: x = 2^e·f with f in [√½, √2], ln f = 2·atanh(s) = 2·Σ s^(2k+1)/(2k+1) with
// s = (f − 1)/(f + 1), |s| ≤ 0.1716. Twelve terms leave s²^12/25 < 2e-20 behind; the rounding of s (≤ 1.5 ulp)
// dominates, so the result is within a few ulp of the true ln x (the test measures it against libm).
FUSEPACK_INIT_HD inline double log_atanh_series(double x) {
  constexpr double kSqrt2 = 1.4142135623730951;
  constexpr double kLn2Hi = 0.6931471805599453, kLn2Lo = 2.3190468138462996e-17;  // ln 2 = hi + lo to 2^-107
  constexpr double kInvOdd[12] = {1.0,
                                  0.3333333333333333,
                                  0.2,
                                  0.14285714285714285,
                                  0.1111111111111111,
                                  0.09090909090909091,
                                  0.07692307692307693,
                                  0.06666666666666667,
                                  0.058823529411764705,
                                  0.05263157894736842,
                                  0.047619047619047616,
                                  0.043478260869565216};  // 1/(2k+1), correctly rounded
  std::uint64_t const b = bits_of(x);
  int e = static_cast<int>((b >> 52) & 0x7FF) - 1023;
  double f = bit_cast<double>((b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);  // [1, 2)
  if (f > kSqrt2) {
    f = mul_rn(f, 0.5);
    ++e;
  }
  double const s = div_rn(f - 1.0, f + 1.0);  // f − 1 is exact (Sterbenz)
  double const s2 = mul_rn(s, s);
  double q = kInvOdd[11];
  for (int k = 10; k >= 0; --k) q = fma_rn(q, s2, kInvOdd[k]);
  double const ln_f = mul_rn(mul_rn(2.0, s), q);
  double const de = static_cast<double>(e);
  return fma_rn(de, kLn2Hi, fma_rn(de, kLn2Lo, ln_f));
}

// cos(2π·n/2^53) for n in [0, 2^53). The reduction to the nearest quarter turn is done on the integer, exactly; what
// is left, |a| ≤ π/4, goes into Taylor series of cos and sin to the a^18 and a^19 terms (next terms < 4e-21).
FUSEPACK_INIT_HD inline double cos_turns53(std::uint64_t n) {
  constexpr double kPi = 3.141592653589793;
  constexpr double kCos[10] = {1.0,
                               -0.5,
                               0.041666666666666664,
                               -0.001388888888888889,
                               2.48015873015873e-05,
                               -2.755731922398589e-07,
                               2.08767569878681e-09,
                               -1.1470745597729725e-11,
                               4.779477332387385e-14,
                               -1.5619206968586225e-16};  // (−1)^k/(2k)!
  constexpr double kSin[10] = {1.0,
                               -0.16666666666666666,
                               0.008333333333333333,
                               -0.0001984126984126984,
                               2.7557319223985893e-06,
                               -2.505210838544172e-08,
                               1.6059043836821613e-10,
                               -7.647163731819816e-13,
                               2.8114572543455206e-15,
                               -8.22063524662433e-18};  // (−1)^k/(2k+1)!
  std::uint64_t const quarter = (n + (std::uint64_t{1} << 50)) >> 51;  // nearest multiple of 2^51: 0..4
  auto const d = static_cast<std::int64_t>(n) - static_cast<std::int64_t>(quarter << 51);  // [−2^50, 2^50)
  double const a = mul_rn(static_cast<double>(d), kPi * 0x1p-52);  // 2π·d/2^53, |a| ≤ π/4
  double const a2 = mul_rn(a, a);
  bool const want_sin = (quarter & 1) != 0;
  // a select per coefficient, not a pointer to either table: that would put both tables in CUDA local memory
  double p = want_sin ? kSin[9] : kCos[9];
  for (int k = 8; k >= 0; --k) p = fma_rn(p, a2, want_sin ? kSin[k] : kCos[k]);
  if (want_sin) p = mul_rn(a, p);
  // cos(q·π/2 + a) = cos a, −sin a, −cos a, sin a for q = 0, 1, 2, 3
  return (quarter & 3) == 1 || (quarter & 3) == 2 ? -p : p;
}

// ---- the element --------------------------------------------------------------------------------------------------

inline constexpr double kALogLow = 0.01, kALogHigh = 16.0;

// Element j (row-major flat index) of a parameter with Philox key `key`.
//   kNormal: initializer_range · sqrt(−2 ln u1) · cos(2π u2), u1, u2 = (2m + 1)/2^53 from 52 bits each, so u is in
//            (0, 1) and never 0: |value| ≤ 8.6 · initializer_range.
//   kALog:   ln v, v = 0.01 + 15.99·u from 53 bits, u in [0, 1), v clamped below 16: v in [0.01, 16).
FUSEPACK_INIT_HD inline double init_element(std::uint64_t key, std::uint64_t j, ParameterInit init,
                                             double initializer_range) {
  if (init == ParameterInit::kZeros) return 0.0;
  if (init == ParameterInit::kOnes) return 1.0;
  Philox4x32 const r = philox4x32_10(
      Philox4x32{{static_cast<std::uint32_t>(j), static_cast<std::uint32_t>(j >> 32), 0u, 0u}},
      static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(key >> 32));
  std::uint64_t const w0 = (std::uint64_t{r.v[0]} << 32) | r.v[1];
  std::uint64_t const w1 = (std::uint64_t{r.v[2]} << 32) | r.v[3];
  if (init == ParameterInit::kALog) {
    constexpr double kBelowHigh = 15.999999999999998;  // the double just below 16: 16 − 2^-49
    double const u = mul_rn(static_cast<double>(w0 >> 11), 0x1p-53);
    double const v = fma_rn(kALogHigh - kALogLow, u, kALogLow);
    return log_atanh_series(v < kALogHigh ? v : kBelowHigh);
  }
  std::uint64_t const n1 = ((w0 >> 12) << 1) | 1u;  // odd, < 2^53: exact as a double
  double const u1 = mul_rn(static_cast<double>(n1), 0x1p-53);
  double const radius = sqrt_rn(mul_rn(-2.0, log_atanh_series(u1)));
  double const z = mul_rn(radius, cos_turns53(((w1 >> 12) << 1) | 1u));
  return mul_rn(initializer_range, z);
}

// ---- rounding a double to the output dtype, round to nearest even -------------------------------------------------

FUSEPACK_INIT_HD inline float round_to_float(double v) {
#ifdef __CUDA_ARCH__
  return __double2float_rn(v);
#else
  return static_cast<float>(v);
#endif
}

// v rounded to fp32 toward zero with the last bit set when inexact ("round to odd"): rounding that to a format of at
// most 22 significand bits gives the same as rounding v directly, where double → fp32 → bf16 could round twice.
FUSEPACK_INIT_HD inline float round_to_odd_float(double v) {
  float const f = round_to_float(v);
  double const back = static_cast<double>(f);
  if (back == v) return f;
  std::uint32_t b = bits_of(f);
  if (v < 0 ? back < v : back > v) --b;  // rounded away from zero: one step back toward it (finite values only)
  return bit_cast<float>(b | 1u);
}

FUSEPACK_INIT_HD inline std::uint16_t round_to_bf16_bits(double v) {
  std::uint32_t const b = bits_of(round_to_odd_float(v));
  return static_cast<std::uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

FUSEPACK_INIT_HD inline std::uint16_t round_to_fp16_bits(double v) {
  std::uint32_t x = bits_of(round_to_odd_float(v));
  auto const sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7C00u | (x > 0x7F800000u ? 0x200u : 0u));
  if (x >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // ≥ 65520 rounds to infinity
  std::uint32_t h, rest, half;
  if (x >= 0x38800000u) {  // normal fp16: rebias the exponent, keep 10 of 23 fraction bits
    h = (x - 0x38000000u) >> 13;
    rest = x & 0x1FFFu;
    half = 0x1000u;
  } else {  // subnormal fp16: h = |v|·2^24
    int const shift = 126 - static_cast<int>(x >> 23);
    if (shift > 24) return sign;  // below 2^-25: rounds to zero
    std::uint32_t const m = (x & 0x7FFFFFu) | 0x800000u;
    h = m >> shift;
    rest = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
  }
  if (rest > half || (rest == half && (h & 1u))) ++h;  // a carry into the exponent is the right rounding
  return static_cast<std::uint16_t>(sign | h);
}

}  // namespace fusepack::model::init_math
