// RapidCheck generators of random packings for the no-leak properties: example lengths (length-1 examples always
// possible, zero-length ones where the op allows them), small head counts and dims per op, and seeds from which the
// activations are drawn. Shrinking goes toward few, short examples and the smallest shapes. Only RapidCheck and the
// reference types here (no gtest): the GPU kernel tests reuse these generators.
#pragma once

#include "reference/tensor.h"

#include <rapidcheck.h>

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <vector>

namespace fusepack::props {

// A packed row of examples, described by their lengths.
struct Packing {
  std::vector<std::int32_t> lengths;  // [N], N >= 1; zeros only where PackingLimits::allow_empty

  std::vector<std::int32_t> cu_seqlens() const;  // [N+1]: 0, l0, l0+l1, ...
  std::int32_t num_tokens() const;
  std::int32_t num_examples() const { return static_cast<std::int32_t>(lengths.size()); }
};
void showValue(Packing const& packing, std::ostream& os);

struct PackingLimits {
  int max_examples = 6;
  int max_length = 9;
  bool allow_empty = false;  // zero-length examples (ops whose cu_seqlens may repeat a value)
  int min_length() const { return allow_empty ? 0 : 1; }
};

struct Conv1dShape {
  ref::Index C = 1, W = 1;  // channels, width 1..4
  bool silu = false;
  bool with_state = false;  // an initial_state [N, C, W-1]
};
void showValue(Conv1dShape const& shape, std::ostream& os);

struct AttentionShape {
  ref::Index Hq = 1, Hkv = 1, D = 1, Dv = 1;  // Hq a multiple of Hkv (GQA)
  bool gated = false;                         // an output gate [T, Hq, Dv]
};
void showValue(AttentionShape const& shape, std::ostream& os);

struct GatedDeltaShape {
  ref::Index Hk = 1, Hv = 1, K = 1, V = 1;  // Hv a multiple of Hk
  bool use_qk_l2norm = false;
  bool with_state = false;          // an initial_state [N, Hv, K, V]
  bool output_final_state = false;  // the final_state [N, Hv, K, V] is an output
};
void showValue(GatedDeltaShape const& shape, std::ostream& os);

struct RopeShape {
  ref::Index H = 1, D = 2, rotary_dim = 2;  // rotary_dim even, 2..D
  double theta = 1e4;
};
void showValue(RopeShape const& shape, std::ostream& os);

// Drawn scalars with a type of their own, so a counterexample says what each number is ("seed 3", "example 1").
struct Seed {
  std::uint64_t value = 0;
};
struct ExampleIndex {
  std::int32_t value = 0;
};
struct ExampleLength {
  std::int32_t value = 0;
};
void showValue(Seed seed, std::ostream& os);
void showValue(ExampleIndex index, std::ostream& os);
void showValue(ExampleLength length, std::ostream& os);

// One seed from several words (a case seed, an example index, a stream tag).
std::uint64_t mix(std::initializer_list<std::uint64_t> words);

// Activations are drawn from a seed rather than generated value by value: a counterexample then reads as shapes,
// lengths and one seed, and shrinking a length keeps every other example's values. Every value is a bfloat16 number
// (8 significant bits), so a kernel test can feed the same bits to a bf16, fp16-range or fp32 kernel and widen them for
// the fp64 reference (docs/contracts.md, numerics).
double round_to_bf16(double x);
ref::Tensor normal_tensor(ref::Shape shape, std::uint64_t seed, double stddev = 1.0);
ref::Tensor uniform_tensor(ref::Shape shape, std::uint64_t seed, double lo, double hi);

namespace gen {

rc::Gen<Packing> packing(PackingLimits limits = {});
rc::Gen<Seed> seed();                                   // never shrinks
rc::Gen<ExampleIndex> example_index(std::int32_t count);  // in [0, count), shrinking toward 0
rc::Gen<ExampleLength> example_length(PackingLimits limits = {});
rc::Gen<Conv1dShape> conv1d_shape();
rc::Gen<AttentionShape> attention_shape();
rc::Gen<GatedDeltaShape> gated_delta_shape();
rc::Gen<RopeShape> rope_shape();

}  // namespace gen
}  // namespace fusepack::props
