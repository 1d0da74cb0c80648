// The process's place in a distributed run, from the environment torchrun sets (the same variables by hand work too):
// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and torchrun's TORCHELASTIC_USE_AGENT_STORE
// (its agent already hosts the rendezvous store on MASTER_PORT) and TORCHELASTIC_RESTART_COUNT. No torch here.
#pragma once

#include <map>
#include <string>

namespace fusepack::parallel {

struct DistEnv {
  bool launched = false;  // WORLD_SIZE is set: this process is one rank of a launched group (possibly of one)
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun's agent hosts the store: every rank is a client, keys under "/worker/attempt_<restart_count>".
  bool use_agent_store = false;
  int restart_count = 0;

  // Reads the variables of `env` (the process environment when not given). Throws std::invalid_argument naming the
  // variable: a value that is not a number, RANK outside [0, WORLD_SIZE), LOCAL_RANK outside LOCAL_WORLD_SIZE, RANK
  // without WORLD_SIZE, a port outside [1, 65535]. Without WORLD_SIZE: one process, launched = false.
  static DistEnv from_environment();
  static DistEnv from_map(std::map<std::string, std::string> const& env);

  std::string describe() const;  // "rank 1 of 4 (local 1 of 2), rendezvous 10.0.0.1:29500 via torchrun's agent store"
};

}  // namespace fusepack::parallel
