// FUSEPACK_RC_REQUIRE(condition, message): inside a RapidCheck case, fails the case with `message` (anything that
// streams into an ostringstream) when `condition` is false. The message is built only on failure, so it can name the
// example, tensor and index that broke the property. RapidCheck only, no gtest: kernel tests can use it too.
#pragma once

#include <rapidcheck.h>

#include <sstream>

#define FUSEPACK_RC_REQUIRE(condition, message) \
  do {                                          \
    if (!(condition)) {                         \
      std::ostringstream fusepack_rc_os_;       \
      fusepack_rc_os_ << message;               \
      RC_FAIL(fusepack_rc_os_.str());           \
    }                                           \
  } while (0)
