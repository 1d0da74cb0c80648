// The collectives sharded training runs on, over one c10d process group (ProcessGroupNCCL for CUDA tensors,
// ProcessGroupGloo for CPU tensors) and the store it met on. Reductions are SUMs only: callers scale explicitly, as
// Gloo's AVG has returned the SUM in some releases (PyTorch issue 162338) and NCCL's AVG over one rank is unreliable.
// Every collective and store operation has a timeout. When one fails, the error names the collective, this rank,
// and what the store knows of the others: each rank publishes a heartbeat (and the collective it is in) there every
// second, so a rank that died, was stopped or fell behind is named rather than the run hanging or failing mutely.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace c10d {
class Backend;
class Store;
class Work;
}  // namespace c10d

namespace fusepack::parallel {

struct DistEnv;

// A collective or the rendezvous failed; what() is the whole diagnosis (several lines).
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CollectivesOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};  // each collective, the rendezvous, each store call
  std::chrono::milliseconds heartbeat{1000};                    // how often liveness is published to the store
};

class Collectives {
 public:
  // Over an existing process group; `device` is where collective tensors live (CUDA for NCCL, CPU for Gloo).
  Collectives(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> backend, c10::Device device,
              CollectivesOptions options);
  virtual ~Collectives();
  Collectives(Collectives const&) = delete;
  Collectives& operator=(Collectives const&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  c10::Device device() const { return device_; }
  std::string backend_name() const;
  CollectivesOptions const& options() const { return options_; }

  // `what` names the collective in errors ("all-gather of layer 3"). All tensors contiguous, on device().
  // out [world_size · in.numel()] = every rank's `in`, in rank order.
  virtual void all_gather(at::Tensor& out, at::Tensor& in, std::string const& what);
  // in [world_size · out.numel()]: out = Σ over ranks of their in's chunk number rank().
  virtual void reduce_scatter_sum(at::Tensor& out, at::Tensor& in, std::string const& what);
  // t = Σ over ranks of t, in place.
  virtual void all_reduce_sum(at::Tensor& t, std::string const& what);
  // t = root's t.
  virtual void broadcast(at::Tensor& t, int root, std::string const& what);

  // Every rank's string (in rank order), exchanged through the store; for settings and descriptions, not data.
  std::vector<std::string> exchange(std::string const& mine, std::string const& what);
  // The step shown in heartbeats and errors.
  void set_step(std::int64_t step) { step_ = step; }
  // Ends the process group (NCCL communicators are aborted cleanly); no collective may follow.
  void shutdown();

 protected:
  // Runs `op` as collective `what`: counted, published in the heartbeat, its exceptions turned into a diagnosis.
  template <typename Op>
  void run(std::string const& what, Op&& op);
  std::string diagnose(std::string const& what, std::string const& reason);
  void wait(c10::intrusive_ptr<c10d::Work> const& work) const;

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;

 private:
  void heartbeat_loop();
  std::string heartbeat_key(int rank) const;

  c10::Device device_;
  CollectivesOptions options_;
  int rank_ = 0;
  int world_size_ = 1;
  std::atomic<std::int64_t> step_{-1};
  std::atomic<std::int64_t> seq_{0};  // collectives entered so far
  std::mutex what_mutex_;
  std::string current_;               // the collective in progress or last run
  std::int64_t exchanges_ = 0;
  c10::intrusive_ptr<c10d::Store> heartbeat_store_;  // a client of its own, for the heartbeat thread
  std::atomic<bool> stop_{false};
  std::thread heartbeat_;
};

// `error` is this rank's outcome of a piece of work every rank does (empty: it went well). Exchanged; when any rank
// failed, every rank throws the same std::runtime_error "<what> failed: rank r: <error>; ...", so none goes on alone
// into a collective the others have left. Null `comm`: one process (throws when `error` is not empty).
void require_all_ranks(Collectives* comm, std::string const& error, std::string const& what);

// The process group of a launched run (env.launched): the rendezvous store (a client of torchrun's agent store when
// torchrun hosts one, else a TCPStore served by rank 0 at MASTER_ADDR:MASTER_PORT), then NCCL when `device` is CUDA
// (the process takes cuda:LOCAL_RANK) or Gloo when it is the CPU (interface from GLOO_SOCKET_IFNAME, else the loopback
// address when MASTER_ADDR is local, else the host's name). Throws CollectiveError naming what did not come up.
std::shared_ptr<Collectives> init_collectives(DistEnv const& env, c10::Device device, CollectivesOptions options);

// Builds the Collectives of one rank over its store and process group: a subclass may stand in (tests plant
// faulty reductions that way, as FSDP2 lets users plug in their own all-gather and reduce-scatter).
using MakeCollectives = std::function<std::shared_ptr<Collectives>(
    c10::intrusive_ptr<c10d::Store>, c10::intrusive_ptr<c10d::Backend>, c10::Device, CollectivesOptions)>;

// `count` ranks as threads of this process, for tests: Gloo over one in-memory store; returns one Collectives per
// rank (constructed concurrently, as the rendezvous requires), made by `make` (default: Collectives itself). Turns off
// torch's flight recorder for the process (TORCH_FR_BUFFER_SIZE=0) before its first group: it is not safe with
// several ranks' process groups in one process (see collectives.cpp).
std::vector<std::shared_ptr<Collectives>> local_gloo_group(int count, CollectivesOptions options,
                                                           MakeCollectives const& make = {});

}  // namespace fusepack::parallel
