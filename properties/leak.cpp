#include "properties/leak.h"

#include "properties/require.h"

#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

namespace fusepack::props {
namespace {

using ref::Index;
using ref::Tensor;

constexpr std::uint64_t kInputStream = 0x494E;    // "IN"
constexpr std::uint64_t kDoutStream = 0x444F;     // "DO"
constexpr std::uint64_t kPerturbStream = 0x5045;  // "PE"

Index row_size(ref::Shape const& shape) {
  Index n = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

std::vector<Tensor> rows_of(std::vector<Tensor> const& ts, Index start, Index count) {
  std::vector<Tensor> out;
  for (Tensor const& t : ts) out.push_back(rows(t, start, count));
  return out;
}

// Example n of a pack: its token rows and its row of every example tensor.
PackTensors example_part(PackTensors const& pack, std::vector<std::int32_t> const& cu, Index n) {
  return {rows_of(pack.token, cu[n], cu[n + 1] - cu[n]), rows_of(pack.example, n, 1)};
}

PackTensors concat(std::vector<PackTensors> const& parts) {
  PackTensors out;
  for (std::size_t e = 0; e < parts.front().token.size(); ++e) {
    std::vector<Tensor> ts;
    for (PackTensors const& p : parts) ts.push_back(p.token[e]);
    out.token.push_back(cat_rows(ts));
  }
  for (std::size_t e = 0; e < parts.front().example.size(); ++e) {
    std::vector<Tensor> ts;
    for (PackTensors const& p : parts) ts.push_back(p.example[e]);
    out.example.push_back(cat_rows(ts));
  }
  return out;
}

// Random tensors shaped like `like` (zeros when `zero`), undefined where `like` is.
PackTensors random_like(PackTensors const& like, std::uint64_t seed, bool zero = false) {
  PackTensors out;
  std::uint64_t k = 0;
  auto make = [&](Tensor const& t) {
    ++k;
    if (!t.defined()) return Tensor();
    return zero ? Tensor(t.shape()) : normal_tensor(t.shape(), mix({seed, k}));
  };
  for (Tensor const& t : like.token) out.token.push_back(make(t));
  for (Tensor const& t : like.example) out.example.push_back(make(t));
  return out;
}

// cu_seqlens of example n of a pack computed alone.
std::vector<std::int32_t> alone_cu(std::vector<std::int32_t> const& cu, Index n) { return {0, cu[n + 1] - cu[n]}; }

std::string index_str(ref::Shape const& shape, Index flat) {
  std::vector<Index> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  std::ostringstream os;
  os << "[";
  for (std::size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
  os << "]";
  return os.str();
}

// The first element where `got` differs from `want` beyond the tolerance (exactly, when the tolerance is 0), as
// "<name>[index]: got vs want"; empty when they agree.
std::string first_difference(std::string const& name, Tensor const& got, Tensor const& want, IsolationTolerance tol) {
  if (got.defined() != want.defined()) return name + ": defined in one and not in the other";
  if (!got.defined()) return {};
  if (got.shape() != want.shape()) {
    return name + ": shape " + ref::shape_str(got.shape()) + " vs " + ref::shape_str(want.shape());
  }
  for (Index i = 0; i < got.numel(); ++i) {
    double const a = got.data()[i], b = want.data()[i];
    bool const same = tol.atol == 0 && tol.rtol == 0 ? a == b : std::abs(a - b) <= tol.atol + tol.rtol * std::abs(b);
    if (!same) {
      std::ostringstream os;
      os.precision(17);
      os << name << index_str(got.shape(), i) << ": " << a << " vs " << b;
      return os.str();
    }
  }
  return {};
}

std::string first_difference(std::vector<std::string> const& names, PackTensors const& got, PackTensors const& want,
                             IsolationTolerance tol) {
  std::size_t k = 0;
  for (std::size_t e = 0; e < got.token.size(); ++e, ++k) {
    std::string d = first_difference(names.at(k), got.token[e], want.token.at(e), tol);
    if (!d.empty()) return d;
  }
  for (std::size_t e = 0; e < got.example.size(); ++e, ++k) {
    std::string d = first_difference(names.at(k), got.example[e], want.example.at(e), tol);
    if (!d.empty()) return d;
  }
  return {};
}

std::vector<std::string> grad_names(PackedOp const& op) {
  std::vector<std::string> names;
  for (std::string const& n : op.input_names()) names.push_back("d" + n);
  return names;
}

std::string lengths_str(std::vector<std::int32_t> const& lengths) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < lengths.size(); ++i) os << (i ? ", " : "") << lengths[i];
  os << "]";
  return os.str();
}

Packing draw_packing(PackingLimits const& limits) {
  Packing const packing = *gen::packing(limits);
  // Printed with the number of passing cases: how often the degenerate cases of docs/contracts.md, numerics came up.
  auto const& l = packing.lengths;
  RC_CLASSIFY(l.size() == 1, "one example");
  RC_CLASSIFY(std::count(l.begin(), l.end(), 1) > 0, "a length-1 example");
  RC_CLASSIFY(std::count(l.begin(), l.end(), 0) > 0, "a zero-length example");
  return packing;
}

// Inputs of every example of a packing, example n drawn from (seed, n).
std::vector<PackTensors> draw_inputs(PackedOp const& op, Packing const& packing, std::uint64_t seed) {
  std::vector<PackTensors> in;
  for (std::int32_t n = 0; n < packing.num_examples(); ++n) {
    in.push_back(op.example_inputs(packing.lengths[n], mix({seed, kInputStream, static_cast<std::uint64_t>(n)})));
  }
  return in;
}

// Output gradients for every example, shaped like its part of `out`, example n drawn from (seed, n).
std::vector<PackTensors> draw_output_grads(PackTensors const& out, std::vector<std::int32_t> const& cu,
                                           std::uint64_t seed) {
  std::vector<PackTensors> dout;
  for (Index n = 0; n + 1 < static_cast<Index>(cu.size()); ++n) {
    dout.push_back(random_like(example_part(out, cu, n), mix({seed, kDoutStream, static_cast<std::uint64_t>(n)})));
  }
  return dout;
}

}  // namespace

Tensor rows(Tensor const& t, Index start, Index count) {
  if (!t.defined()) return {};
  ref::Shape shape = t.shape();
  Index const row = row_size(shape);
  shape[0] = count;
  Tensor out(shape);
  out.flat() = t.flat().segment(start * row, count * row);
  return out;
}

Tensor cat_rows(std::vector<Tensor> const& parts) {
  if (parts.empty() || !parts.front().defined()) return {};
  ref::Shape shape = parts.front().shape();
  shape[0] = 0;
  for (Tensor const& p : parts) shape[0] += p.shape()[0];
  Tensor out(shape);
  Index offset = 0;
  for (Tensor const& p : parts) {
    out.flat().segment(offset, p.numel()) = p.flat();
    offset += p.numel();
  }
  return out;
}

void check_isolation(PackedOp const& op, PackingLimits const& limits, IsolationTolerance tol) {
  Packing const packing = draw_packing(limits);
  std::uint64_t const seed = (*gen::seed()).value;
  std::vector<std::int32_t> const cu = packing.cu_seqlens();
  std::vector<PackTensors> const ex_in = draw_inputs(op, packing, seed);
  PackTensors const in = concat(ex_in);
  PackTensors const out = op.forward(in, cu);
  std::vector<PackTensors> const ex_dout = draw_output_grads(out, cu, seed);
  PackTensors const grad = op.backward(concat(ex_dout), in, cu);
  for (Index n = 0; n < packing.num_examples(); ++n) {
    std::vector<std::int32_t> const cu_alone = alone_cu(cu, n);
    std::string d = first_difference(op.output_names(), example_part(out, cu, n), op.forward(ex_in[n], cu_alone), tol);
    FUSEPACK_RC_REQUIRE(d.empty(), op.name() << ": example " << n << " of the pack " << lengths_str(packing.lengths)
                                             << " differs from the example computed alone: " << d
                                             << " (pack vs alone)");
    d = first_difference(grad_names(op), example_part(grad, cu, n), op.backward(ex_dout[n], ex_in[n], cu_alone), tol);
    FUSEPACK_RC_REQUIRE(d.empty(), op.name() << ": the input gradient of example " << n << " of the pack "
                                             << lengths_str(packing.lengths)
                                             << " differs from the example's computed alone: " << d
                                             << " (pack vs alone)");
  }
}

void check_perturbation_invariance(PackedOp const& op, PackingLimits const& limits) {
  Packing const packing = draw_packing(limits);
  std::uint64_t const seed = (*gen::seed()).value;
  std::int32_t const j = (*gen::example_index(packing.num_examples())).value;
  std::int32_t const new_length = (*gen::example_length(limits)).value;
  Packing perturbed = packing;
  perturbed.lengths[j] = new_length;
  std::vector<std::int32_t> const cu = packing.cu_seqlens(), cu2 = perturbed.cu_seqlens();

  std::vector<PackTensors> const ex_in = draw_inputs(op, packing, seed);
  std::vector<PackTensors> ex_in2 = ex_in;
  ex_in2[j] = op.example_inputs(new_length, mix({seed, kPerturbStream, kInputStream}));
  PackTensors const in = concat(ex_in), in2 = concat(ex_in2);
  PackTensors const out = op.forward(in, cu), out2 = op.forward(in2, cu2);
  std::vector<PackTensors> const ex_dout = draw_output_grads(out, cu, seed);
  std::vector<PackTensors> ex_dout2 = ex_dout;
  ex_dout2[j] = random_like(example_part(out2, cu2, j), mix({seed, kPerturbStream, kDoutStream}));
  PackTensors const grad = op.backward(concat(ex_dout), in, cu), grad2 = op.backward(concat(ex_dout2), in2, cu2);

  for (Index n = 0; n < packing.num_examples(); ++n) {
    if (n == j) continue;
    std::string d = first_difference(op.output_names(), example_part(out2, cu2, n), example_part(out, cu, n), {});
    FUSEPACK_RC_REQUIRE(d.empty(), op.name() << ": replacing example " << j << " of the pack "
                                             << lengths_str(packing.lengths) << " by another of length " << new_length
                                             << " changed example " << n << ": " << d << " (after vs before)");
    d = first_difference(grad_names(op), example_part(grad2, cu2, n), example_part(grad, cu, n), {});
    FUSEPACK_RC_REQUIRE(d.empty(), op.name() << ": replacing example " << j << " of the pack "
                                             << lengths_str(packing.lengths) << " by another of length " << new_length
                                             << " changed the input gradient of example " << n << ": " << d
                                             << " (after vs before)");
  }
}

void check_zero_cross_gradient(PackedOp const& op, PackingLimits const& limits) {
  Packing const packing = draw_packing(limits);
  std::uint64_t const seed = (*gen::seed()).value;
  std::int32_t const i = (*gen::example_index(packing.num_examples())).value;
  std::vector<std::int32_t> const cu = packing.cu_seqlens();
  PackTensors const in = concat(draw_inputs(op, packing, seed));
  PackTensors const out = op.forward(in, cu);
  std::vector<PackTensors> dout;
  for (Index n = 0; n < packing.num_examples(); ++n) {
    dout.push_back(random_like(example_part(out, cu, n), mix({seed, kDoutStream, static_cast<std::uint64_t>(n)}),
                               /*zero=*/n != i));
  }
  PackTensors const grad = op.backward(concat(dout), in, cu);
  for (Index n = 0; n < packing.num_examples(); ++n) {
    if (n == i) continue;
    PackTensors const g = example_part(grad, cu, n);
    std::string const d = first_difference(grad_names(op), g, random_like(g, 0, /*zero=*/true), {});
    FUSEPACK_RC_REQUIRE(d.empty(), op.name() << ": with the output gradient nonzero only on example " << i
                                             << " of the pack " << lengths_str(packing.lengths)
                                             << ", example " << n << " gets a nonzero input gradient: " << d
                                             << " (got vs 0)");
  }
}

PackTensors PackWideOp::forward(PackTensors const& in, std::vector<std::int32_t> const& cu_seqlens) const {
  Index const N = static_cast<Index>(cu_seqlens.size()) - 1;
  PackTensors one{in.token, rows_of(in.example, 0, 1)};
  PackTensors out = inner_->forward(one, {0, cu_seqlens.back()});
  for (Tensor& e : out.example) {
    if (!e.defined()) continue;
    std::vector<Tensor> parts(static_cast<std::size_t>(N), Tensor(e.shape()));
    parts.back() = e;
    e = cat_rows(parts);
  }
  return out;
}

PackTensors PackWideOp::backward(PackTensors const& dout, PackTensors const& in,
                                 std::vector<std::int32_t> const& cu_seqlens) const {
  Index const N = static_cast<Index>(cu_seqlens.size()) - 1;
  PackTensors one{in.token, rows_of(in.example, 0, 1)};
  PackTensors const dout_one{dout.token, rows_of(dout.example, N - 1, 1)};
  PackTensors grad = inner_->backward(dout_one, one, {0, cu_seqlens.back()});
  for (Tensor& e : grad.example) {
    if (!e.defined()) continue;
    std::vector<Tensor> parts(static_cast<std::size_t>(N), Tensor(e.shape()));
    parts.front() = e;
    e = cat_rows(parts);
  }
  return grad;
}

}  // namespace fusepack::props
