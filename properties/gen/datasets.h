// RapidCheck generators of datasets for the packing properties: tokenized examples (length >= 1, as a dataset load
// guarantees) with random supervision masks, and packer options that respect the oversize policy. Shrinking goes
// toward few, short, fully supervised examples of token 0. Only RapidCheck and the packing types here (no gtest).
#pragma once

#include "packing/example.h"
#include "packing/packer.h"

#include <rapidcheck.h>

#include <cstdint>
#include <iosfwd>
#include <vector>

namespace fusepack::packing {

// RapidCheck prints counterexamples with showValue, found by argument-dependent lookup in the type's namespace.
void showValue(Example const& example, std::ostream& os);
void showValue(PackerOptions const& options, std::ostream& os);
void showValue(PlanMode mode, std::ostream& os);

}  // namespace fusepack::packing

namespace fusepack::props {

struct DatasetLimits {
  int max_examples = 7;
  int max_length = 10;
  std::int32_t vocab_size = 50;
};

struct Epoch {
  std::uint64_t value = 0;
};
void showValue(Epoch epoch, std::ostream& os);

namespace gen {

// input_ids in [0, vocab_size); labels[p] is -100 (not supervised) or input_ids[p] (HF convention, unshifted).
rc::Gen<packing::Example> example(DatasetLimits limits = {});
rc::Gen<std::vector<packing::Example>> dataset(DatasetLimits limits = {});
// Token budget in [1, max_budget] (at least `longest` under OversizePolicy::kError, so planning never throws),
// look-ahead 1, 2, 3 or 64, any shuffle seed (shrinking toward 0), either oversize policy.
rc::Gen<packing::PackerOptions> packer_options(std::int64_t longest, std::int64_t max_budget);
rc::Gen<packing::PlanMode> plan_mode();
rc::Gen<Epoch> epoch();  // 0, 1 or 2

}  // namespace gen
}  // namespace fusepack::props
