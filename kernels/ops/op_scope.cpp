#include "kernels/ops/op_scope.h"

#include <map>
#include <mutex>
#include <tuple>

namespace fusepack::ops {
namespace {

using Key = std::tuple<std::string, Pass, Backend>;

struct Ledger {
  std::mutex mutex;
  std::map<Key, std::int64_t> calls;
};

Ledger& ledger() {
  static Ledger l;
  return l;
}

}  // namespace

char const* pass_name(Pass pass) { return pass == Pass::kForward ? "forward" : "backward"; }

void count_op_run(char const* op, Pass pass, Backend implementation) {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> const lock(l.mutex);
  ++l.calls[Key{op, pass, implementation}];
}

std::vector<OpRunCount> op_run_counts() {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> const lock(l.mutex);
  std::vector<OpRunCount> out;
  for (auto const& [key, calls] : l.calls) out.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), calls});
  return out;
}

void reset_op_run_counts() {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> const lock(l.mutex);
  l.calls.clear();
}

std::vector<OpRunCount> op_runs_not_on(Backend requested) {
  std::vector<OpRunCount> out;
  for (OpRunCount const& r : op_run_counts()) {
    if (r.implementation != requested) out.push_back(r);
  }
  return out;
}

std::string describe_op_runs(std::vector<OpRunCount> const& runs) {
  std::string out;
  for (OpRunCount const& r : runs) {
    out += (out.empty() ? "" : "; ") + r.op + " " + pass_name(r.pass) + " ran " + backend_name(r.implementation) + " " +
           std::to_string(r.calls) + (r.calls == 1 ? " time" : " times");
  }
  return out;
}

}  // namespace fusepack::ops
