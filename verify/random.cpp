#include "verify/random.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace fusepack::verify {

ref::Tensor randn(ref::Shape shape, std::mt19937_64& rng, double stddev) {
  ref::Tensor t(std::move(shape));
  std::normal_distribution<double> dist(0.0, stddev);
  for (ref::Index i = 0; i < t.numel(); ++i) t.data()[i] = dist(rng);
  return t;
}

ref::Tensor uniform(ref::Shape shape, std::mt19937_64& rng, double lo, double hi) {
  ref::Tensor t(std::move(shape));
  std::uniform_real_distribution<double> dist(lo, hi);
  for (ref::Index i = 0; i < t.numel(); ++i) t.data()[i] = dist(rng);
  return t;
}

ref::Tensor randn_rows_away_from_zero(ref::Shape const& shape, std::mt19937_64& rng, double min_norm) {
  ref::Tensor x(shape);
  ref::Index const D = shape.empty() ? 0 : shape.back();
  for (ref::Index r = 0; D > 0 && r < x.numel() / D; ++r) {
    do {
      x.flat().segment(r * D, D) = randn({D}, rng).flat();
    } while (x.flat().segment(r * D, D).norm() < min_norm);
  }
  return x;
}

int uniform_int(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

std::vector<std::int32_t> cu_seqlens_from_lengths(std::vector<int> const& lengths) {
  std::vector<std::int32_t> cu{0};
  for (int len : lengths) {
    if (len < 0) throw std::invalid_argument("cu_seqlens_from_lengths: negative length " + std::to_string(len));
    if (len > std::numeric_limits<std::int32_t>::max() - cu.back()) {
      throw std::invalid_argument("cu_seqlens_from_lengths: the lengths add up to more than int32 offsets hold (" +
                                  std::to_string(std::numeric_limits<std::int32_t>::max()) + ")");
    }
    cu.push_back(cu.back() + len);
  }
  return cu;
}

std::vector<int> random_lengths(std::mt19937_64& rng, int count, int min_len, int max_len) {
  std::vector<int> lengths(count);
  for (int& l : lengths) l = uniform_int(rng, min_len, max_len);
  return lengths;
}

}  // namespace fusepack::verify
