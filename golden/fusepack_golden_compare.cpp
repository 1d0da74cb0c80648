// fusepack-golden-compare: compares a run's records with a golden file, both in the golden format (FORMAT.md), and
// prints the step-by-step table and the verdict. Exit code 0 when every check passes, 1 when one fails, 2 on an
// error (an unreadable file, a bad tolerance; message on stderr).
#include "golden/compare.h"
#include "golden/golden_file.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace fusepack::golden;

void add_tolerance(CLI::App& app, std::string const& field, FieldTolerance& tol) {
  app.add_option("--" + field + "-atol", tol.atol, field + ": absolute tolerance")->capture_default_str();
  app.add_option("--" + field + "-rtol", tol.rtol, field + ": tolerance relative to |golden|")->capture_default_str();
  app.add_option("--" + field + "-drift", tol.drift_per_step, field + ": extra allowance per step (drifting runs)")
      ->capture_default_str();
}

void print_provenance(char const* which, GoldenFile const& f) {
  Provenance const& p = f.provenance;
  std::printf("%-7s %zu steps; %s, %s, world size %lld, seed %llu; commit %s, %s\n  command: %s\n  batching: %s\n",
              which, f.steps.size(), p.dtype.c_str(), p.device.c_str(), static_cast<long long>(p.world_size),
              static_cast<unsigned long long>(p.seed), p.commit.c_str(), p.date.c_str(), p.command.c_str(),
              p.batching.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Compares a run with a golden loss file step by step (tokens exactly; loss, grad_norm and lr within "
               "atol + rtol*|golden| + drift*step). Without tolerance options: the tolerances fusepack-train's "
               "--golden-check derives for the two files' dtypes (fp64 or fp32 run, fp64 golden); --exact demands "
               "equality.",
               "fusepack-golden-compare"};
  std::string golden_path, run_path;
  TolerancePolicy policy;
  app.add_option("golden", golden_path, "the golden file")->required();
  app.add_option("run", run_path, "the run's records, in the same format")->required();
  add_tolerance(app, "loss", policy.loss);
  add_tolerance(app, "grad-norm", policy.grad_norm);
  add_tolerance(app, "lr", policy.lr);
  std::string baseline_path;
  double floor_rel = 0;
  auto* baseline_opt =
      app.add_option("--baseline", baseline_path,
                     "instead of fixed tolerances: the golden's own run repeated in the run's (low-precision) dtype; "
                     "allowed = 2*|baseline - golden| + floor-rel*|golden| per step (golden/FORMAT.md)");
  auto* floor_opt = app.add_option("--floor-rel", floor_rel,
                                   "with --baseline, required: one rounding step of the run's dtype (bf16: 0.00390625)");
  floor_opt->needs(baseline_opt);
  baseline_opt->needs(floor_opt);
  double baseline_limit_rel = 0;
  app.add_option("--baseline-limit-rel", baseline_limit_rel,
                 "with --baseline: how far the baseline itself may be from the golden, relative, at any step "
                 "(default: --floor-rel; fusepack-train uses 1 rounding step for bf16, 8 for fp32)")
      ->needs(baseline_opt);
  bool exact = false;
  auto* exact_opt = app.add_flag("--exact", exact, "every value equal to the golden's (no tolerance)");
  exact_opt->excludes(baseline_opt);
  std::vector<std::string> tolerance_flags;
  for (char const* field : {"loss", "grad-norm", "lr"}) {
    for (char const* kind : {"-atol", "-rtol", "-drift"}) {
      tolerance_flags.push_back(std::string("--") + field + kind);
      baseline_opt->excludes(tolerance_flags.back());
      exact_opt->excludes(tolerance_flags.back());
    }
  }
  try {
    app.parse(argc, argv);
  } catch (CLI::ParseError const& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "fusepack-golden-compare: %s\nRun with --help for more information.\n", e.what());
    return 2;
  }
  if (app.count("--baseline-limit-rel") == 0) baseline_limit_rel = floor_rel;
  for (auto [flag, value] : {std::pair<char const*, double>{"--floor-rel", floor_rel},
                             std::pair<char const*, double>{"--baseline-limit-rel", baseline_limit_rel}}) {
    if (!(std::isfinite(value) && value >= 0)) {
      std::fprintf(stderr, "fusepack-golden-compare: %s must be a finite number >= 0; got %g\n", flag, value);
      return 2;
    }
  }
  try {
    GoldenFile const golden = read_golden(golden_path);
    GoldenFile const run = read_golden(run_path);
    print_provenance("golden:", golden);
    print_provenance("run:", run);
    if (golden.provenance.model_config != run.provenance.model_config) {
      std::printf("note: the model configs differ\n");
    }
    bool const given = std::any_of(tolerance_flags.begin(), tolerance_flags.end(),
                                   [&](std::string const& f) { return app.count(f) > 0; });
    if (baseline_path.empty() && !given && !exact) {
      policy = derived_tolerance(run.provenance.dtype, golden.provenance.dtype);
      std::printf("tolerances: derived for a %s run against a %s golden, as fusepack-train --golden-check uses them\n",
                  run.provenance.dtype.c_str(), golden.provenance.dtype.c_str());
    }
    Comparison const c = baseline_path.empty()
                             ? compare(golden, run.steps, policy)
                             : compare_with_baseline(golden, read_golden(baseline_path).steps, run.steps, floor_rel,
                                                     baseline_limit_rel);
    std::printf("%s", c.table().c_str());
    return c.passed() ? 0 : 1;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "fusepack-golden-compare: %s\n", e.what());
    return 2;
  }
}
