#include "trainer/parallel/dist_env.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

extern char** environ;

namespace fusepack::parallel {
namespace {

int parse_int(std::map<std::string, std::string> const& env, char const* name, int fallback) {
  auto const it = env.find(name);
  if (it == env.end() || it->second.empty()) return fallback;
  std::string const& v = it->second;
  std::size_t used = 0;
  long value = 0;
  try {
    value = std::stol(v, &used);
  } catch (std::exception const&) {
    used = 0;
  }
  if (used != v.size() || value < 0 || value > 1'000'000'000) {
    throw std::invalid_argument(std::string("environment variable ") + name + "='" + v +
                                "' is not a non-negative integer");
  }
  return static_cast<int>(value);
}

}  // namespace

DistEnv DistEnv::from_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string const kv = *e;
    std::size_t const eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return from_map(env);
}

DistEnv DistEnv::from_map(std::map<std::string, std::string> const& env) {
  DistEnv d;
  bool const has_world = env.count("WORLD_SIZE") > 0 && !env.at("WORLD_SIZE").empty();
  if (!has_world) {
    if (env.count("RANK") > 0 && !env.at("RANK").empty()) {
      throw std::invalid_argument("environment variable RANK is set but WORLD_SIZE is not (launch with torchrun, or "
                                  "set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)");
    }
    return d;
  }
  d.launched = true;
  d.world_size = parse_int(env, "WORLD_SIZE", 1);
  d.rank = parse_int(env, "RANK", 0);
  d.local_world_size = parse_int(env, "LOCAL_WORLD_SIZE", d.world_size);
  d.local_rank = parse_int(env, "LOCAL_RANK", d.rank % std::max(1, d.local_world_size));
  d.master_port = parse_int(env, "MASTER_PORT", d.master_port);
  d.restart_count = parse_int(env, "TORCHELASTIC_RESTART_COUNT", 0);
  if (env.count("MASTER_ADDR") > 0 && !env.at("MASTER_ADDR").empty()) d.master_addr = env.at("MASTER_ADDR");
  auto const agent = env.find("TORCHELASTIC_USE_AGENT_STORE");
  d.use_agent_store =
      agent != env.end() && (agent->second == "True" || agent->second == "true" || agent->second == "1");
  if (d.world_size < 1) throw std::invalid_argument("environment variable WORLD_SIZE must be >= 1; got 0");
  if (d.rank >= d.world_size) {
    throw std::invalid_argument("environment variable RANK=" + std::to_string(d.rank) + " is outside WORLD_SIZE=" +
                                std::to_string(d.world_size) + " (expected 0.." + std::to_string(d.world_size - 1) +
                                ")");
  }
  if (d.local_world_size < 1 || d.local_rank >= d.local_world_size) {
    throw std::invalid_argument("environment variable LOCAL_RANK=" + std::to_string(d.local_rank) +
                                " is outside LOCAL_WORLD_SIZE=" + std::to_string(d.local_world_size));
  }
  if (d.master_port < 1 || d.master_port > 65535) {
    throw std::invalid_argument("environment variable MASTER_PORT=" + std::to_string(d.master_port) +
                                " is not a TCP port (1..65535)");
  }
  return d;
}

std::string DistEnv::describe() const {
  if (!launched) return "one process (no WORLD_SIZE in the environment)";
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (local " +
         std::to_string(local_rank) + " of " + std::to_string(local_world_size) + "), rendezvous " + master_addr + ":" +
         std::to_string(master_port) + (use_agent_store ? " via torchrun's agent store" : "");
}

}  // namespace fusepack::parallel
