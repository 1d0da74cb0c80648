#include "reference/checks.h"

#include <sstream>
#include <stdexcept>

namespace fusepack::ref {

void fail(std::string const& op, std::string const& message) { throw std::invalid_argument(op + ": " + message); }

void check_rank(std::string const& op, std::string const& name, Tensor const& t, Index rank) {
  if (!t.defined()) fail(op, name + " is required but was not given");
  if (t.dim() != rank) {
    fail(op, name + " must have " + std::to_string(rank) + " dimensions; got shape " + shape_str(t.shape()));
  }
}

void check_shape(std::string const& op, std::string const& name, Tensor const& t, Shape const& expected) {
  check_rank(op, name, t, static_cast<Index>(expected.size()));
  for (size_t d = 0; d < expected.size(); ++d) {
    if (expected[d] >= 0 && t.shape()[d] != expected[d]) {
      std::ostringstream os;
      os << name << " has shape " << shape_str(t.shape()) << "; expected " << expected[d] << " in dimension " << d
         << " (expected shape " << shape_str(expected) << ", -1 = any)";
      fail(op, os.str());
    }
  }
}

void check_cu_seqlens(std::string const& op, std::vector<std::int32_t> const& cu, Index T) {
  if (cu.size() < 2) {
    fail(op, "cu_seqlens needs at least 2 entries (one example); got " + std::to_string(cu.size()));
  }
  if (cu.front() != 0) fail(op, "cu_seqlens must start at 0; got cu_seqlens[0]=" + std::to_string(cu.front()));
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    if (cu[i] > cu[i + 1]) {
      fail(op, "cu_seqlens must be non-decreasing; got cu_seqlens[" + std::to_string(i) + "]=" + std::to_string(cu[i]) +
                   " > cu_seqlens[" + std::to_string(i + 1) + "]=" + std::to_string(cu[i + 1]));
    }
  }
  if (cu.back() != T) {
    fail(op, "cu_seqlens must end at the number of tokens T=" + std::to_string(T) + "; got cu_seqlens[" +
                 std::to_string(cu.size() - 1) + "]=" + std::to_string(cu.back()));
  }
}

void check_positive(std::string const& op, std::string const& name, double value) {
  if (!(value > 0)) fail(op, name + " must be > 0; got " + std::to_string(value));
}

}  // namespace fusepack::ref
