// A profiler range around every fusepack op call, named "fusepack::<op> [composite]" or "fusepack::<op> [fused]":
// a profile (fusepack-train --profile-step) then shows which implementation ran for each op, observed rather than
// assumed from the requested backend. Costs one inactive-callback check per call when no profiler runs.
#pragma once

#include "kernels/ops/backend.h"

#include <ATen/record_function.h>

#include <vector>

// The prefix and suffixes profile.cpp parses.
#define FUSEPACK_OP_SCOPE_PREFIX "fusepack::"

#define FUSEPACK_OP_SCOPE(op, backend)                                                                  \
  RECORD_FUNCTION((backend) == ::fusepack::ops::Backend::kFused ? FUSEPACK_OP_SCOPE_PREFIX op " [fused]" \
                                                                  : FUSEPACK_OP_SCOPE_PREFIX op " [composite]", \
                  std::vector<c10::IValue>())
