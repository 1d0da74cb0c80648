// fusepack-pack: plans one epoch of a dataset (a JSONL file or a synthetic spec) and prints what padded 2D batches
// and 1D packed batches cost at a token budget. Exit code 0 on success, 2 on any error (message on stderr).
#include "packing/dataset.h"
#include "packing/packer.h"
#include "packing/progress.h"
#include "packing/stats.h"
#include "packing/synthetic.h"
#include "trainer/model/config.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace fusepack::packing;
namespace model = fusepack::model;

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string grouped_decimal(double v, int decimals) {
  std::string const s = fixed(v, decimals);
  std::size_t const dot = s.find('.');
  return grouped(std::stoll(s.substr(0, dot))) + (dot == std::string::npos ? "" : s.substr(dot));
}

// Every model preset with its vocabulary, from the one preset table (trainer/model/config.h), in the table's order.
std::vector<std::pair<std::string, std::int64_t>> preset_vocabularies() {
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (std::string const& name : model::preset_names()) out.emplace_back(name, model::preset(name).vocab_size);
  return out;
}

// "qwen35-tiny (vocab 256), qwen35-tiny64 (vocab 256), bench-200m (vocab 32,768), ...": --preset's help.
std::string preset_list() {
  std::string out;
  for (auto const& [name, vocab] : preset_vocabularies()) {
    out += (out.empty() ? "" : ", ") + name + " (vocab " + grouped(vocab) + ")";
  }
  return out;
}

// Ids are checked against --vocab, else --preset's vocabulary, else the largest vocabulary of any preset (every id
// some preset accepts), in which case a hint names the presets that would refuse the data's largest id.
struct Vocabulary {
  std::int64_t size = 0;
  std::string text;         // how the source line names it
  bool by_default = false;  // neither --vocab nor --preset was given
};

Vocabulary choose_vocabulary(std::int64_t vocab, std::string const& preset) {
  if (vocab > 0) return {vocab, "vocab " + grouped(vocab) + " (--vocab)", false};
  if (!preset.empty()) {
    std::int64_t size = 0;
    try {
      size = model::preset(preset).vocab_size;
    } catch (std::invalid_argument const& e) {
      throw std::invalid_argument(std::string("--preset: ") + e.what());
    }
    return {size, "vocab " + grouped(size) + " of preset " + preset, false};
  }
  std::int64_t largest = 0;
  for (auto const& [name, size] : preset_vocabularies()) largest = std::max(largest, size);
  return {largest, "vocab " + grouped(largest) + ", the largest preset's; --preset NAME checks one", true};
}

// One line naming the presets whose vocabulary the data's largest id falls outside of: "hint: ids reach 300, outside
// the vocabulary of qwen35-tiny, qwen35-tiny64 (256): see --preset" (at most ~120 characters with every small preset).
// Empty when every preset takes it.
std::string vocabulary_hint(std::int64_t largest_id) {
  std::map<std::int64_t, std::string> refusing;  // vocabulary -> the presets that have it
  for (auto const& [name, size] : preset_vocabularies()) {
    if (largest_id >= size) refusing[size] += (refusing[size].empty() ? "" : ", ") + name;
  }
  if (refusing.empty()) return {};
  std::string which;
  for (auto const& [size, names] : refusing) which += (which.empty() ? "" : ", ") + names + " (" + grouped(size) + ")";
  return "hint: ids reach " + grouped(largest_id) + ", outside the vocabulary of " + which + ": see --preset";
}

std::string percent(double fraction) { return fixed(100.0 * fraction, 1) + "%"; }

// A seed is an unsigned 64-bit integer; CLI11 reads "-1" as 2^64 - 1, so a sign is refused before it converts.
std::string non_negative_integer(std::string& text) {
  if (text.find('-') == std::string::npos) return {};
  return "must be a non-negative integer (0 to 2^64-1); got " + text;
}

// CLI11's parse errors in the user's terms: the option given twice, or the value that does not convert.
std::string parse_error_message(CLI::App const& app, CLI::ParseError const& e) {
  // A repeated option is an error here (CLI11's default policy); its message "At Most 1 required but received 2"
  // does not say that the option was given twice.
  for (CLI::Option const* o : app.get_options()) {
    if (o->count() < 2 || o->get_expected_max() > 1 || o->get_type_size_max() == 0) continue;
    std::string values;
    for (std::string const& v : o->results()) values += (values.empty() ? "" : ", ") + v;
    return o->get_name() + " was given " + std::to_string(o->count()) + " times (" + values + "): give it once";
  }
  std::string const what = e.what();
  std::string const prefix = "Could not convert: ";
  if (what.rfind(prefix, 0) == 0) {
    std::size_t const eq = what.find(" = ");
    std::string const name = what.substr(prefix.size(), eq == std::string::npos ? std::string::npos
                                                                                  : eq - prefix.size());
    CLI::Option const* o = app.get_option_no_throw(name);
    if (o != nullptr && !o->results().empty()) {
      return name + ": '" + o->results().back() + "' is not a valid " + o->get_type_name() + " value";
    }
  }
  return what;
}

void row(char const* label, std::string const& padded, std::string const& packed) {
  std::printf("  %-26s %14s %14s\n", label, padded.c_str(), packed.c_str());
}

struct Args {
  std::string data;
  std::string synthetic;
  std::int64_t vocab = 0;  // 0 = not given
  std::string preset;      // empty = not given
  PackerOptions packer;
  std::string oversize = "error";
};

int run(Args const& args) {
  PackerOptions options = args.packer;
  options.oversize = parse_oversize_policy(args.oversize);
  options.validate();
  Progress progress;  // long phases (a large file, a large plan) report on stderr every 2 s
  progress.out = &std::cerr;

  Vocabulary const vocab = choose_vocabulary(args.vocab, args.preset);
  std::vector<std::int64_t> lengths;
  std::string source, hint;
  if (!args.data.empty()) {
    std::int32_t largest_id = 0;
    read_jsonl(
        args.data, vocab.size,
        [&](Example&& ex) {
          lengths.push_back(static_cast<std::int64_t>(ex.input_ids.size()));
          largest_id = std::max(largest_id, *std::max_element(ex.input_ids.begin(), ex.input_ids.end()));
        },
        &progress);
    source = args.data + " (ids checked against " + vocab.text + ")";
    if (lengths.empty()) throw std::invalid_argument(args.data + ": no examples (the file is empty or blank)");
    if (vocab.by_default) hint = vocabulary_hint(largest_id);
  } else {
    // As fusepack-train draws it: the vocabulary chosen above unless the spec says vocab=, which may not exceed a
    // preset's. No token is drawn here, only the lengths.
    SyntheticSpec base;
    base.vocab_size = vocab.size;
    SyntheticSpec const spec = parse_synthetic_spec(args.synthetic, base);
    if (!args.preset.empty() && spec.vocab_size > vocab.size) {
      throw std::invalid_argument(args.synthetic + ": vocab=" + std::to_string(spec.vocab_size) +
                                  " exceeds the vocab_size " + std::to_string(vocab.size) + " of --preset " +
                                  args.preset);
    }
    lengths = synthetic_lengths(spec);  // the lengths make_synthetic() would give, without drawing the tokens
    source = spec.str();
  }

  std::vector<std::int64_t> const budgeted = budgeted_lengths(lengths, options);
  EpochPlan const plan = plan_epoch(lengths, options, PlanMode::kFill, 0, &progress);
  BatchingStats const padded = padded_stats(budgeted, plan.padded, options.token_budget);
  BatchingStats const packed = packed_stats(budgeted, plan.packed, options.token_budget);

  // The lower median (what sorting would put at (n - 1) / 2), in linear time: a full sort of 10^8 lengths takes
  // seconds.
  std::vector<std::int64_t> by_length = lengths;
  auto const middle = by_length.begin() + static_cast<std::ptrdiff_t>((by_length.size() - 1) / 2);
  std::nth_element(by_length.begin(), middle, by_length.end());
  auto const [shortest, longest] = std::minmax_element(lengths.begin(), lengths.end());
  std::int64_t total = 0;
  for (std::int64_t l : lengths) total += l;
  auto const over =
      std::count_if(lengths.begin(), lengths.end(), [&](std::int64_t l) { return l > options.token_budget; });

  std::printf("fusepack-pack: %s\n", source.c_str());
  if (!hint.empty()) std::printf("  %s\n", hint.c_str());
  std::printf("  token budget %s, lookahead %s, seed %llu, oversize %s\n\n", grouped(options.token_budget).c_str(),
              grouped(options.lookahead).c_str(), static_cast<unsigned long long>(options.seed),
              oversize_policy_name(options.oversize));
  std::printf("  %-26s %14s\n", "examples", grouped(static_cast<std::int64_t>(lengths.size())).c_str());
  std::printf("  %-26s %14s\n", "tokens", grouped(total).c_str());
  if (over > 0)
    std::printf("  %-26s %14s   (cut to the budget: %s tokens kept)\n", "examples over the budget",
                grouped(over).c_str(), grouped(packed.tokens).c_str());
  std::printf("  %-26s %s / %s / %s / %s (min / median / mean / max)\n\n", "example length",
              grouped(*shortest).c_str(), grouped(*middle).c_str(),
              grouped_decimal(static_cast<double>(total) / static_cast<double>(lengths.size()), 1).c_str(),
              grouped(*longest).c_str());

  row("", "padded (2D)", "packed (1D)");
  row("batches", grouped(padded.batches), grouped(packed.batches));
  row("padding fraction", percent(padded.padding_fraction()), percent(packed.padding_fraction()));
  row("budget fill", percent(padded.budget_fill()), percent(packed.budget_fill()));
  row("tokens per batch: min", grouped(padded.min_tokens_per_batch), grouped(packed.min_tokens_per_batch));
  row("                  mean", grouped_decimal(padded.mean_tokens_per_batch, 1),
      grouped_decimal(packed.mean_tokens_per_batch, 1));
  row("                  max", grouped(padded.max_tokens_per_batch), grouped(packed.max_tokens_per_batch));
  row("examples per batch (mean)", fixed(padded.mean_examples_per_batch, 2), fixed(packed.mean_examples_per_batch, 2));
  double const reduction = 1.0 - static_cast<double>(packed.batches) / static_cast<double>(padded.batches);
  std::printf("\n  packing needs %s fewer batches than padding (%s vs %s)\n", percent(reduction).c_str(),
              grouped(packed.batches).c_str(), grouped(padded.batches).c_str());
  std::printf(
      "  padding fraction = padded slots / all slots (rows x longest); budget fill = tokens / (batches x "
      "budget)\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Plans one epoch and prints what padded 2D and packed 1D batches cost at a token budget.",
               "fusepack-pack"};
  Args args;
  auto* data = app.add_option("--data", args.data,
                              "JSONL dataset: {\"input_ids\": [...], \"labels\": [...]} per line, or a synthetic "
                              "spec (synthetic:..., as --synthetic and as fusepack-train --data take it)");
  auto* synthetic = app.add_option("--synthetic", args.synthetic,
                                   "synthetic:n=10000,median=900,sigma=0.9,vocab=32768,min=1,max=8192,prompt=0,seed=1");
  data->excludes(synthetic);
  auto* vocab = app.add_option("--vocab", args.vocab,
                               "vocabulary size: ids of --data are checked against it; for --synthetic it applies when "
                               "the spec has no vocab= (default: the largest preset vocabulary, with a hint naming "
                               "the presets that would refuse the data's ids)");
  auto* preset = app.add_option("--preset", args.preset,
                                "check ids against this model preset's vocabulary, as fusepack-train --preset does: " +
                                    preset_list());
  vocab->excludes(preset);
  app.add_option("--budget", args.packer.token_budget, "token budget of a batch")->capture_default_str();
  app.add_option("--lookahead", args.packer.lookahead, "examples the packer may look ahead")->capture_default_str();
  app.add_option("--seed", args.packer.seed, "shuffle seed")
      ->capture_default_str()
      ->check(CLI::Validator(non_negative_integer, "UINT64"));
  app.add_option("--oversize", args.oversize, "examples longer than the budget: error or truncate")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (CLI::ParseError const& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "fusepack-pack: %s\nRun with --help for more information.\n",
                 parse_error_message(app, e).c_str());
    return 2;
  }
  if (args.packer.token_budget < 1 || args.packer.token_budget > (std::int64_t{1} << 30)) {
    std::fprintf(stderr, "fusepack-pack: --budget must be in [1, 2^30]; got %lld\n",
                 static_cast<long long>(args.packer.token_budget));
    return 2;
  }
  if (args.packer.lookahead < 1) {
    std::fprintf(stderr, "fusepack-pack: --lookahead must be >= 1; got %lld\n",
                 static_cast<long long>(args.packer.lookahead));
    return 2;
  }
  // fusepack-train's spelling: --data takes a synthetic spec too.
  if (args.data.rfind("synthetic:", 0) == 0) args.synthetic = std::exchange(args.data, std::string());
  if (args.data.empty() == args.synthetic.empty()) {
    std::fprintf(stderr, "fusepack-pack: give exactly one of --data FILE.jsonl or --synthetic SPEC\n");
    return 2;
  }
  if (app.count("--vocab") > 0 && args.vocab < 1) {
    std::fprintf(stderr, "fusepack-pack: --vocab must be >= 1; got %lld\n", static_cast<long long>(args.vocab));
    return 2;
  }
  try {
    return run(args);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "fusepack-pack: %s\n", e.what());
    return 2;
  }
}
