// Where every fusepack op ran, recorded by the code that runs it (the composite's body, the fused autograd
// function's forward and backward), never by the dispatcher that chose it: an op that fell back to another
// implementation inside itself shows the implementation that ran. Two records of each run:
// - a profiler range "fusepack::<op> [fused]" (or "fusepack::<op> backward [composite]", ...), which
//   fusepack-train --profile-step lists; it costs one inactive-callback check when no profiler runs;
// - a count per (op, pass, implementation) since the last reset, which the trainer checks after every step
//   against the backend it asked for (a mutex and a map lookup per op call: nothing next to a kernel launch).
#pragma once

#include "kernels/ops/backend.h"

#include <ATen/record_function.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fusepack::ops {

enum class Pass { kForward, kBackward };

char const* pass_name(Pass pass);  // "forward", "backward"

struct OpRunCount {
  std::string op;
  Pass pass = Pass::kForward;
  Backend implementation = Backend::kComposite;
  std::int64_t calls = 0;
};

// Counts one run (thread-safe: the autograd engine runs backwards on its own threads).
void count_op_run(char const* op, Pass pass, Backend implementation);
// Every run since the last reset, ordered by op, pass and implementation.
std::vector<OpRunCount> op_run_counts();
void reset_op_run_counts();
// The runs of an implementation other than `requested`; empty when every op ran as asked.
std::vector<OpRunCount> op_runs_not_on(Backend requested);
// "rmsnorm forward ran composite 4 times; ..." for the runs given.
std::string describe_op_runs(std::vector<OpRunCount> const& runs);

}  // namespace fusepack::ops

// The prefix profile.cpp parses.
#define FUSEPACK_OP_SCOPE_PREFIX "fusepack::"

// At the top of the code that runs `op` (a string literal) as `implementation` in `pass`. The range is
// RECORD_FUNCTION's, under a name of its own (RECORD_FUNCTION declares `guard`, which the fused paths use for their
// CUDAGuard).
#define FUSEPACK_OP_RUNS(op, pass, implementation)                                                          \
  ::fusepack::ops::count_op_run(op, pass, implementation);                                                   \
  ::at::RecordFunction fusepack_op_range_(::at::RecordScope::FUNCTION);                                      \
  if (fusepack_op_range_.isActive()) {                                                                       \
    ::at::detail::record_function_with_scope(                                                                \
        fusepack_op_range_,                                                                                  \
        (implementation) == ::fusepack::ops::Backend::kFused                                                 \
            ? ((pass) == ::fusepack::ops::Pass::kForward ? FUSEPACK_OP_SCOPE_PREFIX op " [fused]"            \
                                                         : FUSEPACK_OP_SCOPE_PREFIX op " backward [fused]")  \
            : ((pass) == ::fusepack::ops::Pass::kForward ? FUSEPACK_OP_SCOPE_PREFIX op " [composite]"        \
                                                         : FUSEPACK_OP_SCOPE_PREFIX op " backward [composite]"), \
        std::vector<c10::IValue>());                                                                         \
  }

// A named profiler range around code that is not one op, which fusepack-train --profile-step attributes GPU and host
// time to: a decoder layer ("fusepack.layer 3 linear_attention"), a group of GEMMs ("fusepack.gemm mlp"), the
// optimizer's update ("fusepack.optimizer"). `name` (a const char* or std::string expression) is evaluated only
// while a profiler runs; otherwise the range costs one inactive-callback check.
#define FUSEPACK_RANGE_PREFIX "fusepack."
#define FUSEPACK_PROFILE_RANGE(var, name)                 \
  ::at::RecordFunction var(::at::RecordScope::USER_SCOPE); \
  if (var.isActive()) ::at::detail::record_function_with_scope(var, name, std::vector<c10::IValue>())
