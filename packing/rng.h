// Deterministic random numbers for shuffles and synthetic data. The standard distributions (and std::shuffle) are
// implementation-defined, so "same seed -> same batches" would not hold across standard libraries; these are
// spelled out: SplitMix64 (Steele, Lea, Flood 2014), unbiased rejection for bounded integers, Box-Muller normals.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

namespace fusepack::packing {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One seed from several words (a base seed, a stream tag, an epoch, an example index, ...).
inline std::uint64_t mix_seed(std::initializer_list<std::uint64_t> words) {
  std::uint64_t h = 0x243F6A8885A308D3ull;
  for (std::uint64_t w : words) h = splitmix64(h ^ w);
  return h;
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, n), n >= 1, without modulo bias.
  std::uint64_t below(std::uint64_t n) {
    std::uint64_t const limit = ~std::uint64_t{0} - (~std::uint64_t{0} % n);
    std::uint64_t x = next();
    while (x >= limit) x = next();
    return x % n;
  }

  // Uniform in (0, 1]: never 0, so log() is finite.
  double uniform01() { return static_cast<double>((next() >> 11) + 1) * 0x1.0p-53; }

  double normal() {
    double const r = std::sqrt(-2.0 * std::log(uniform01()));
    return r * std::cos(6.283185307179586 * uniform01());
  }

 private:
  std::uint64_t state_;
};

// Fisher-Yates.
template <class T>
void shuffle(std::vector<T>& v, Rng& rng) {
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

}  // namespace fusepack::packing
