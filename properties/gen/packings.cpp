#include "properties/gen/packings.h"

#include "packing/rng.h"

#include <algorithm>
#include <cstring>
#include <ostream>
#include <utility>

namespace fusepack::props {

std::vector<std::int32_t> Packing::cu_seqlens() const {
  std::vector<std::int32_t> cu{0};
  for (std::int32_t len : lengths) cu.push_back(cu.back() + len);
  return cu;
}

std::int32_t Packing::num_tokens() const { return cu_seqlens().back(); }

void showValue(Packing const& packing, std::ostream& os) {
  os << "Packing{lengths [";
  for (std::size_t i = 0; i < packing.lengths.size(); ++i) os << (i ? ", " : "") << packing.lengths[i];
  os << "]}";
}

void showValue(Conv1dShape const& s, std::ostream& os) {
  os << "Conv1dShape{C=" << s.C << ", W=" << s.W << (s.silu ? ", silu" : "") << (s.with_state ? ", initial_state" : "")
     << "}";
}

void showValue(AttentionShape const& s, std::ostream& os) {
  os << "AttentionShape{Hq=" << s.Hq << ", Hkv=" << s.Hkv << ", D=" << s.D << ", Dv=" << s.Dv
     << (s.gated ? ", gated" : "") << "}";
}

void showValue(GatedDeltaShape const& s, std::ostream& os) {
  os << "GatedDeltaShape{Hk=" << s.Hk << ", Hv=" << s.Hv << ", K=" << s.K << ", V=" << s.V
     << (s.use_qk_l2norm ? ", qk_l2norm" : "") << (s.with_state ? ", initial_state" : "")
     << (s.output_final_state ? ", final_state" : "") << "}";
}

void showValue(RopeShape const& s, std::ostream& os) {
  os << "RopeShape{H=" << s.H << ", D=" << s.D << ", rotary_dim=" << s.rotary_dim << ", theta=" << s.theta << "}";
}

void showValue(Seed seed, std::ostream& os) { os << "seed " << seed.value; }
void showValue(ExampleIndex index, std::ostream& os) { os << "example " << index.value; }
void showValue(ExampleLength length, std::ostream& os) { os << "length " << length.value; }

std::uint64_t mix(std::initializer_list<std::uint64_t> words) { return packing::mix_seed(words); }

double round_to_bf16(double x) {
  // Round to float, then to the nearest bfloat16 (ties to even) by rounding away the low 16 bits of the float.
  float const f = static_cast<float>(x);
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  bits &= 0xFFFF0000u;
  float r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

ref::Tensor normal_tensor(ref::Shape shape, std::uint64_t seed, double stddev) {
  ref::Tensor t(std::move(shape));
  packing::Rng rng(seed);
  for (ref::Index i = 0; i < t.numel(); ++i) t.data()[i] = round_to_bf16(stddev * rng.normal());
  return t;
}

ref::Tensor uniform_tensor(ref::Shape shape, std::uint64_t seed, double lo, double hi) {
  ref::Tensor t(std::move(shape));
  packing::Rng rng(seed);
  for (ref::Index i = 0; i < t.numel(); ++i) t.data()[i] = round_to_bf16(lo + (hi - lo) * rng.uniform01());
  return t;
}

namespace gen {
namespace {

// Uniform in [lo, hi] whatever the size, shrinking toward lo.
template <class T>
rc::Gen<T> between(T lo, T hi) {
  return rc::gen::resize(100, rc::gen::inRange<T>(lo, hi + 1));
}

}  // namespace

rc::Gen<Packing> packing(PackingLimits limits) {
  // RapidCheck's size (0..max_size, 100 by default) grows over a run: the first cases are one or two short
  // examples, later ones up to the limits (sizes above 100 stay at the limits). Containers shrink by dropping examples, lengths toward the minimum.
  return rc::gen::withSize([limits](int size) {
    int const s = std::clamp(size, 0, 100);
    int const lo = limits.min_length();
    // At least two examples may be drawn from the first case on: a leak needs a neighbour.
    int const max_n = std::min(std::max(limits.max_examples, 1), 2 + (limits.max_examples - 2) * s / 100);
    int const hi = std::max(1, lo + (limits.max_length - lo) * s / 100);
    return rc::gen::map(
        rc::gen::resize(max_n, rc::gen::nonEmpty(rc::gen::container<std::vector<std::int32_t>>(
                                   between<std::int32_t>(lo, hi)))),
        [](std::vector<std::int32_t> lengths) { return Packing{std::move(lengths)}; });
  });
}

rc::Gen<Seed> seed() {
  return rc::gen::map(rc::gen::noShrink(rc::gen::arbitrary<std::uint64_t>()), [](std::uint64_t v) { return Seed{v}; });
}

rc::Gen<ExampleIndex> example_index(std::int32_t count) {
  return rc::gen::map(between<std::int32_t>(0, count - 1), [](std::int32_t v) { return ExampleIndex{v}; });
}

rc::Gen<ExampleLength> example_length(PackingLimits limits) {
  return rc::gen::map(rc::gen::inRange<std::int32_t>(limits.min_length(), limits.max_length + 1),
                      [](std::int32_t v) { return ExampleLength{v}; });
}

rc::Gen<Conv1dShape> conv1d_shape() {
  return rc::gen::map(rc::gen::tuple(between<ref::Index>(1, 4), between<ref::Index>(1, 4), rc::gen::arbitrary<bool>(),
                                     rc::gen::arbitrary<bool>()),
                      [](std::tuple<ref::Index, ref::Index, bool, bool> const& t) {
                        return Conv1dShape{std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t)};
                      });
}

rc::Gen<AttentionShape> attention_shape() {
  return rc::gen::map(rc::gen::tuple(between<ref::Index>(1, 2), between<ref::Index>(1, 2), between<ref::Index>(1, 4),
                                     between<ref::Index>(1, 4), rc::gen::arbitrary<bool>()),
                      [](std::tuple<ref::Index, ref::Index, ref::Index, ref::Index, bool> const& t) {
                        ref::Index const hkv = std::get<0>(t), group = std::get<1>(t);
                        return AttentionShape{hkv * group, hkv, std::get<2>(t), std::get<3>(t), std::get<4>(t)};
                      });
}

rc::Gen<GatedDeltaShape> gated_delta_shape() {
  return rc::gen::map(
      rc::gen::tuple(between<ref::Index>(1, 2), between<ref::Index>(1, 2), between<ref::Index>(1, 4),
                     between<ref::Index>(1, 4), rc::gen::arbitrary<bool>(), rc::gen::arbitrary<bool>(),
                     rc::gen::arbitrary<bool>()),
      [](std::tuple<ref::Index, ref::Index, ref::Index, ref::Index, bool, bool, bool> const& t) {
        ref::Index const hk = std::get<0>(t), group = std::get<1>(t);
        return GatedDeltaShape{hk,         hk * group,     std::get<2>(t), std::get<3>(t),
                               std::get<4>(t), std::get<5>(t), std::get<6>(t)};
      });
}

rc::Gen<RopeShape> rope_shape() {
  // rotary_dim = 2·half, D = rotary_dim + pass-through channels; theta of Llama (1e4) or Qwen3.5 (1e7).
  return rc::gen::map(rc::gen::tuple(between<ref::Index>(1, 2), between<ref::Index>(1, 3), between<ref::Index>(0, 2),
                                     rc::gen::element(1e4, 1e7)),
                      [](std::tuple<ref::Index, ref::Index, ref::Index, double> const& t) {
                        ref::Index const rotary_dim = 2 * std::get<1>(t);
                        return RopeShape{std::get<0>(t), rotary_dim + std::get<2>(t), rotary_dim, std::get<3>(t)};
                      });
}

}  // namespace gen
}  // namespace fusepack::props
