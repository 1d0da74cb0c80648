#include "trainer/train/run_data.h"

#include "packing/dataset.h"
#include "packing/synthetic.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

namespace fusepack::train {

bool is_synthetic(std::string const& data) { return data.rfind("synthetic:", 0) == 0; }

Data load_data(std::string const& data, std::string const& option, std::int64_t vocab_size,
               packing::Progress const* progress) {
  Data d;
  if (is_synthetic(data)) {
    packing::SyntheticSpec base;
    base.vocab_size = vocab_size;  // the model's vocabulary unless the spec says vocab=
    packing::SyntheticSpec const spec = packing::parse_synthetic_spec(data, base);
    if (spec.vocab_size > vocab_size) {
      throw std::invalid_argument(option + " " + data + ": vocab=" + std::to_string(spec.vocab_size) +
                                  " exceeds the model's vocab_size " + std::to_string(vocab_size));
    }
    packing::ProgressPhase phase(progress, "drawing " + data);
    d.examples = packing::make_synthetic(spec);
    phase.done(packing::grouped(static_cast<std::int64_t>(d.examples.size())) + " examples");
    d.description["synthetic"] = spec.str();
  } else {
    if (std::filesystem::is_directory(data)) {
      throw std::invalid_argument(option + " " + data + ": is a directory; give a JSONL file or a synthetic:... spec");
    }
    if (!std::filesystem::is_regular_file(data)) {
      throw std::invalid_argument(option + ": no file '" + data + "' (give a JSONL file or a synthetic:... spec)");
    }
    packing::read_jsonl_numbered(
        data, vocab_size,
        [&](packing::Example&& ex, std::int64_t line) {
          d.examples.push_back(std::move(ex));
          d.lines.push_back(line);
        },
        progress);
    if (d.examples.empty()) throw std::invalid_argument(option + " " + data + ": no examples (the file is empty)");
    d.description["path"] = data;
  }
  std::int64_t tokens = 0, supervised = 0;
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a over every id and label: ranks compare their data by it
  auto mix = [&hash](std::int64_t v) {
    for (int b = 0; b < 8; ++b, v >>= 8) hash = (hash ^ static_cast<std::uint64_t>(v & 0xff)) * 1099511628211ull;
  };
  for (packing::Example const& e : d.examples) {
    tokens += static_cast<std::int64_t>(e.input_ids.size());
    for (std::size_t p = 1; p < e.labels.size(); ++p) supervised += e.labels[p] != packing::kIgnoreIndex;
    mix(static_cast<std::int64_t>(e.input_ids.size()));
    for (auto id : e.input_ids) mix(id);
    for (auto label : e.labels) mix(label);
  }
  d.description["examples"] = d.examples.size();
  d.description["tokens"] = tokens;
  d.description["targets"] = supervised;  // shifted targets of the whole dataset (uncut)
  d.content_hash = hash;
  return d;
}

// Every example must keep a target token (a label other than -100 after its first token) once cut to the budget:
// one without adds nothing to the loss, and a step made only of such examples has no loss at all, which was found
// only at that step. A one-token example never has a target and is let through unless its label is -100.
void check_targets(Data const& d, std::string const& data, TrainConfig const& c) {
  bool const truncate = c.oversize == packing::OversizePolicy::kTruncate;
  std::vector<std::string> bad;
  std::int64_t count = 0, dataset_targets = 0;
  for (std::size_t i = 0; i < d.examples.size(); ++i) {
    std::vector<std::int32_t> const& labels = d.examples[i].labels;
    auto const len = static_cast<std::int64_t>(labels.size());
    std::int64_t const kept = truncate ? std::min(len, c.token_budget) : len;
    std::int64_t targets = 0, kept_targets = 0;
    for (std::int64_t p = 1; p < len; ++p) {
      targets += labels[p] != packing::kIgnoreIndex;
      kept_targets += p < kept && labels[p] != packing::kIgnoreIndex;
    }
    dataset_targets += kept_targets;
    bool const masked = targets == 0 && (len >= 2 || labels[0] == packing::kIgnoreIndex);
    if (!masked && kept_targets > 0) continue;
    if (!masked && targets == 0) continue;  // a one-token example
    ++count;
    if (bad.size() >= 5) continue;
    std::string const which = d.lines.empty() ? "example " + std::to_string(i)
                                              : "line " + std::to_string(d.lines[i]);
    bad.push_back(masked ? which + " (every label is -100)"
                         : which + " (its " + std::to_string(targets) + " targets lie past the first " +
                               std::to_string(kept) + " tokens, which --oversize truncate keeps at --budget " +
                               std::to_string(c.token_budget) + ")");
  }
  if (count == 0 && dataset_targets > 0) return;
  std::string list;
  for (std::string const& b : bad) list += (list.empty() ? "" : ", ") + b;
  if (count > static_cast<std::int64_t>(bad.size())) list += ", and " + std::to_string(count - bad.size()) + " more";
  if (count == 0) {
    throw std::invalid_argument("data " + data + ": no example has a target token (a label other than -100 after its "
                                "first token); there is nothing to train on");
  }
  throw std::invalid_argument("data " + data + ": " + std::to_string(count) + " example(s) have no target token (a "
                              "label other than -100 after the first token), so a step made of them has no loss: " +
                              list + "; remove them or unmask their targets");
}

packing::PackerOptions packer_options(TrainConfig const& c) {
  packing::PackerOptions o;
  o.token_budget = c.token_budget;
  o.lookahead = c.lookahead;
  o.seed = c.seed;
  o.oversize = c.oversize;
  o.complete_packs = c.complete_packs;  // the filler's tokens are id 0, which every vocabulary has
  return o;
}

std::vector<packing::BatchPlan> epoch_micro_batches(std::vector<std::int64_t> const& lengths,
                                                   packing::PackerOptions const& options, packing::PlanMode mode,
                                                   Batching batching, std::uint64_t epoch,
                                                   packing::Progress const* progress) {
  packing::EpochPlan plan = packing::plan_epoch(lengths, options, mode, epoch, progress);
  return batching == Batching::kPacked ? std::move(plan.packed) : std::move(plan.padded);
}



void MicroBatchStream::restore(std::uint64_t epochs_started, std::int64_t next) {
  plans_.clear();
  next_ = 0;
  epoch_ = 0;
  if (epochs_started == 0) return;
  start_epoch(epochs_started - 1);
  if (next < 0 || next > static_cast<std::int64_t>(plans_.size())) {
    throw std::invalid_argument("resume: the checkpoint's data cursor (entry " + std::to_string(next) + " of epoch " +
                                std::to_string(epoch_ - 1) + ") is outside that epoch's " +
                                std::to_string(plans_.size()) + " micro-batches");
  }
  next_ = static_cast<std::size_t>(next);
}

void MicroBatchStream::start_epoch(std::uint64_t epoch) {
  plans_ = epoch_micro_batches(lengths_, options_, mode_, batching_, epoch, progress_);
  next_ = 0;
  epoch_ = epoch + 1;
}

EvalSet plan_eval_set(TrainConfig const& c, std::int64_t vocab_size, packing::PackerOptions const& options,
                      packing::Progress const* progress) {
  EvalSet e;
  e.data = load_data(c.eval_data, "--eval-data", vocab_size, progress);
  std::vector<std::int64_t> kept;
  try {
    kept = packing::budgeted_lengths(packing::example_lengths(e.data.examples), options);
    e.plans = epoch_micro_batches(packing::example_lengths(e.data.examples), options, c.pairing, c.batching, 0,
                                  progress);
  } catch (std::invalid_argument const& error) {
    throw std::invalid_argument("--eval-data " + c.eval_data + ": " + error.what());
  }
  for (std::size_t i = 0; i < kept.size(); ++i) {
    std::vector<std::int32_t> const& labels = e.data.examples[i].labels;
    e.tokens += kept[i];
    for (std::int64_t p = 1; p < kept[i]; ++p) {
      e.targets += labels[static_cast<std::size_t>(p)] != packing::kIgnoreIndex;
    }
  }
  if (e.targets == 0) {
    throw std::invalid_argument("--eval-data " + c.eval_data + ": no example has a target token (a label other than "
                                "-100 after its first token); its loss would be 0 / 0");
  }
  return e;
}

bool evaluates_after(TrainConfig const& c, std::int64_t step) {
  return c.eval_every > 0 && ((step + 1) % c.eval_every == 0 || step + 1 == c.steps);
}

}  // namespace fusepack::train
