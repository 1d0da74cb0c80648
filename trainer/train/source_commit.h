// Which source tree a run was built from, for the provenance that goldens and metrics files record. No torch here.
#pragma once

#include <string>

namespace fusepack::train {

// `git rev-parse HEAD` of the source tree fusepack was built from, "-dirty" appended when it has local changes;
// "unknown" when git or the tree is not there. Runs git twice (popen); call it once per run.
std::string source_commit();

}  // namespace fusepack::train
