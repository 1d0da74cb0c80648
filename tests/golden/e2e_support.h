// What the end-to-end golden tests share: golden/settings.sh's settings as a TrainConfig, the planted packing bug, and
// the measured drift of a comparison. The tests check the settings against each golden's provenance, so a golden
// regenerated with other settings cannot pass unnoticed.
#pragma once

#include "golden/compare.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/model/batch.h"
#include "trainer/train/config.h"
#include "trainer/train/run.h"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

namespace fusepack::test {

// golden/settings.sh for `preset`, on the given layout, backend, dtype and device.
inline train::TrainConfig golden_settings(std::string const& preset, train::Batching batching, ops::Backend backend,
                                          train::DType dtype, std::string const& device) {
  train::TrainConfig c;
  c.preset = preset;
  c.batching = batching;
  c.pairing = packing::PlanMode::kPaired;
  c.backend = backend;
  c.dtype = dtype;
  c.device = device;
  c.threads = 1;
  c.data = "synthetic:n=128,median=40,sigma=0.6,min=1,max=128,prompt=0.25,seed=7";
  c.token_budget = 256;
  c.micro_batches = 2;
  c.steps = 10;
  c.lr = 3e-3;
  c.warmup_steps = 2;
  c.min_lr = 3e-4;
  c.weight_decay = 0.1;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.clip_norm = 1.0;
  c.seed = 1234;
  return c;
}

// run_training as `command`, with an optional planted edit; prints the golden comparison's table when there is one.
inline train::RunResult run_and_print(train::TrainConfig const& config, std::string const& command,
                                      train::MicroBatchEdit edit = {}) {
  train::RunOptions options;
  options.command = command;
  options.edit_micro_batch = std::move(edit);
  train::RunResult r = train::run_training(config, options);
  if (r.comparison) std::printf("%s", r.comparison->table().c_str());
  return r;
}

// The checkpoints (files or folders) at `a` and `b` hold the same tensors, equal to the bit.
inline void expect_same_tensors(std::string const& a, std::string const& b) {
  checkpoint::Safetensors const x = checkpoint::read_checkpoint(a), y = checkpoint::read_checkpoint(b);
  ASSERT_EQ(x.tensors.size(), y.tensors.size()) << a << " vs " << b;
  for (auto const& [name, t] : x.tensors) {
    ASSERT_EQ(y.tensors.count(name), 1u) << name;
    EXPECT_TRUE(at::equal(t, y.tensors.at(name))) << name << ": " << a << " vs " << b;
  }
}

// Max over steps of |run − golden| / |golden| for one field, printed so a tolerance's derivation can be re-measured.
inline double max_rel_diff(golden::Comparison const& c, std::string const& field) {
  double worst = 0;
  for (golden::FieldCheck const& f : c.checks) {
    if (f.field == field && f.golden != 0) worst = std::max(worst, f.diff / std::fabs(f.golden));
  }
  return worst;
}

// The bug a collator makes when it shifts the concatenated labels of a pack once: the prediction at the last token of
// example i targets the first token of example i+1 (labels[t] = tokens[t+1] across the boundary), as if the pack were
// one example. The batch's own invariant check (PackedBatch::validate) would refuse such labels, so the bug is
// planted after it, on the model's batch (on whatever device it lives).
inline void shift_labels_across_boundaries(model::ModelBatch& b) {
  at::Tensor const cu = b.cu_seqlens.to(at::kCPU).to(at::kLong);
  at::Tensor labels = b.labels.to(at::kCPU).clone();
  at::Tensor const tokens = b.tokens.to(at::kCPU);
  std::int64_t const n = b.num_examples;
  auto const* cu_p = cu.data_ptr<std::int64_t>();
  auto* labels_p = labels.data_ptr<std::int64_t>();
  auto const* tokens_p = tokens.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i + 1 < n; ++i) {
    std::int64_t const last = cu_p[i + 1] - 1;
    if (labels_p[last] == model::kIgnoreIndex) ++b.num_targets;
    labels_p[last] = tokens_p[last + 1];
    b.max_label = std::max<std::int32_t>(b.max_label, static_cast<std::int32_t>(tokens_p[last + 1]));
  }
  b.labels = labels.to(b.labels.device());
}

}  // namespace fusepack::test
