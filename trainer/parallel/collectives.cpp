#include "trainer/parallel/collectives.h"

#include "trainer/parallel/dist_env.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <unistd.h>

namespace fusepack::parallel {
namespace {

using Clock = std::chrono::steady_clock;

std::string first_line(std::string const& s) {
  std::size_t const nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

std::vector<std::uint8_t> bytes(std::string const& s) { return {s.begin(), s.end()}; }
std::string text(std::vector<std::uint8_t> const& b) { return {b.begin(), b.end()}; }

// A store's own client for the heartbeat thread (TCPStore clients are not shared across threads here); stores that
// cannot clone (in-memory ones) are thread-safe and shared.
c10::intrusive_ptr<c10d::Store> own_client(c10::intrusive_ptr<c10d::Store> const& store) {
  try {
    return store->clone();
  } catch (std::exception const&) {
    return store;
  }
}

struct Heartbeat {
  bool present = false;
  std::int64_t beat = 0;
  std::int64_t seq = 0;
  std::int64_t step = -1;
  std::string what;
};

Heartbeat parse_heartbeat(std::string const& s) {
  Heartbeat h;
  std::istringstream in(s);
  if (in >> h.beat >> h.seq >> h.step) {
    h.present = true;
    std::getline(in >> std::ws, h.what);
  }
  return h;
}

}  // namespace

Collectives::Collectives(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> backend,
                         c10::Device device, CollectivesOptions options)
    : store_(std::move(store)), backend_(std::move(backend)), device_(device), options_(options) {
  rank_ = backend_->getRank();
  world_size_ = backend_->getSize();
  store_->setTimeout(options_.timeout);
  heartbeat_store_ = own_client(store_);
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

Collectives::~Collectives() {
  stop_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::string Collectives::backend_name() const { return backend_->getBackendName(); }

std::string Collectives::heartbeat_key(int rank) const { return "fusepack/heartbeat/" + std::to_string(rank); }

void Collectives::heartbeat_loop() {
  std::int64_t beat = 0;
  while (!stop_) {
    std::string what;
    {
      std::lock_guard<std::mutex> lock(what_mutex_);
      what = current_;
    }
    try {
      heartbeat_store_->set(heartbeat_key(rank_), bytes(std::to_string(++beat) + " " + std::to_string(seq_.load()) +
                                                        " " + std::to_string(step_.load()) + " " + what));
    } catch (std::exception const&) {
      // The store is gone (its host died): the next collective fails and its diagnosis says so.
    }
    for (auto slept = std::chrono::milliseconds(0); slept < options_.heartbeat && !stop_;
         slept += std::chrono::milliseconds(50)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

std::string Collectives::diagnose(std::string const& what, std::string const& reason) {
  std::ostringstream os;
  os << "rank " << rank_ << " of " << world_size_ << ": " << what << " (collective " << seq_.load()
     << (step_ >= 0 ? ", step " + std::to_string(step_.load()) : std::string()) << ", " << backend_name()
     << ") failed: " << first_line(reason);
  if (world_size_ == 1) return os.str();
  // Two looks at every rank's heartbeat, 2.5 periods apart: a beat that does not move is a rank that died or is
  // stopped; one that moves but sits in an earlier collective fell behind (hung in its own work, or diverged).
  auto look = [&]() -> std::vector<Heartbeat> {
    std::vector<Heartbeat> hb(world_size_);
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) continue;
      if (store_->check({heartbeat_key(r)})) hb[r] = parse_heartbeat(text(store_->get(heartbeat_key(r))));
    }
    return hb;
  };
  try {
    std::vector<Heartbeat> const first = look();
    std::this_thread::sleep_for(options_.heartbeat * 5 / 2);
    std::vector<Heartbeat> const second = look();
    int named = 0;
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) continue;
      Heartbeat const& a = first[r];
      Heartbeat const& b = second[r];
      std::string const where = b.present ? " (last seen in collective " + std::to_string(b.seq) +
                                                (b.what.empty() ? "" : ", " + b.what) +
                                                (b.step >= 0 ? ", step " + std::to_string(b.step) : "") + ")"
                                          : "";
      if (!b.present) {
        os << "\n  rank " << r << ": no heartbeat at all: it never started or died before its first";
        ++named;
      } else if (a.beat == b.beat) {
        os << "\n  rank " << r << ": its heartbeat stopped" << where << ": the process died or is stopped";
        ++named;
      } else if (b.seq < seq_.load()) {
        os << "\n  rank " << r << ": alive but behind" << where << ": hung in its own work, or it runs other steps";
        ++named;
      }
    }
    if (named == 0) os << "\n  every other rank is alive and has reached this collective (see their errors)";
  } catch (std::exception const& e) {
    os << "\n  the rendezvous store does not answer (" << first_line(e.what())
       << "): its host (rank 0, or torchrun's agent) is gone";
  }
  return os.str();
}

template <typename Op>
void Collectives::run(std::string const& what, Op&& op) {
  ++seq_;
  {
    std::lock_guard<std::mutex> lock(what_mutex_);
    current_ = what;
  }
  try {
    op();
  } catch (CollectiveError const&) {
    throw;
  } catch (std::exception const& e) {
    throw CollectiveError(diagnose(what, e.what()));
  }
}

// A synchronous NCCL collective has already been queued on the current stream; Gloo's finishes here.
void Collectives::wait(c10::intrusive_ptr<c10d::Work> const& work) const {
  if (work) work->wait(options_.timeout);
}

void Collectives::all_gather(at::Tensor& out, at::Tensor& in, std::string const& what) {
  TORCH_CHECK(out.numel() == in.numel() * world_size_, "all_gather (", what, "): out has ", out.numel(),
              " elements; expected world_size x in = ", in.numel() * world_size_);
  run(what, [&] {
    c10d::AllgatherOptions o;
    o.timeout = options_.timeout;
    o.asyncOp = false;  // NCCL: on the caller's current stream
    wait(backend_->_allgather_base(out, in, o));
  });
}

void Collectives::reduce_scatter_sum(at::Tensor& out, at::Tensor& in, std::string const& what) {
  TORCH_CHECK(in.numel() == out.numel() * world_size_, "reduce_scatter_sum (", what, "): in has ", in.numel(),
              " elements; expected world_size x out = ", out.numel() * world_size_);
  run(what, [&] {
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = options_.timeout;
    o.asyncOp = false;
    wait(backend_->_reduce_scatter_base(out, in, o));
  });
}

void Collectives::all_reduce_sum(at::Tensor& t, std::string const& what) {
  run(what, [&] {
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = options_.timeout;
    o.asyncOp = false;
    wait(backend_->allreduce(ts, o));
  });
}

void Collectives::broadcast(at::Tensor& t, int root, std::string const& what) {
  run(what, [&] {
    std::vector<at::Tensor> ts{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = options_.timeout;
    o.asyncOp = false;
    wait(backend_->broadcast(ts, o));
  });
}

std::vector<std::string> Collectives::exchange(std::string const& mine, std::string const& what) {
  std::string const prefix = "fusepack/exchange/" + std::to_string(exchanges_++) + "/";
  std::vector<std::string> all(world_size_);
  run(what, [&] {
    store_->set(prefix + std::to_string(rank_), bytes(mine));
    for (int r = 0; r < world_size_; ++r) all[r] = text(store_->get(prefix + std::to_string(r)));  // waits
    // Whoever hosts the store (rank 0 when torchrun does not) leaves only once every rank has read: a rank that
    // stops on what it read (different settings) would otherwise take the store from under the slower ones.
    store_->set(prefix + "read/" + std::to_string(rank_), bytes("1"));
    if (rank_ == 0) {
      std::vector<std::string> keys;
      for (int r = 0; r < world_size_; ++r) keys.push_back(prefix + "read/" + std::to_string(r));
      store_->wait(keys, options_.timeout);
    }
  });
  return all;
}

void Collectives::shutdown() {
  stop_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
  backend_->shutdown();
}

void require_all_ranks(Collectives* comm, std::string const& error, std::string const& what) {
  std::vector<std::string> const all = comm ? comm->exchange(error, what) : std::vector<std::string>{error};
  std::string message;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) message += (message.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + all[r]);
  }
  if (!message.empty()) throw std::runtime_error(what + " failed: " + message);
}

// ---- Construction

namespace {

bool is_loopback(std::string const& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

c10::intrusive_ptr<c10d::Backend> make_gloo(c10::intrusive_ptr<c10d::Store> const& store, int rank, int size,
                                            std::string const& master_addr, std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  char const* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else if (is_loopback(master_addr)) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

}  // namespace

std::shared_ptr<Collectives> init_collectives(DistEnv const& env, c10::Device device, CollectivesOptions options) {
  std::string const where = "rendezvous of " + env.describe();
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(env.master_port);
    o.timeout = options.timeout;
    if (env.use_agent_store) {
      o.isServer = false;
      store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(env.restart_count),
                                                     c10::make_intrusive<c10d::TCPStore>(env.master_addr, o));
    } else {
      o.isServer = env.rank == 0;
      o.numWorkers = env.world_size;
      o.waitWorkers = true;
      store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
    }
  } catch (std::exception const& e) {
    throw CollectiveError(where + ": the store at " + env.master_addr + ":" + std::to_string(env.master_port) +
                          " did not come up within " + std::to_string(options.timeout.count() / 1000) +
                          " s: " + first_line(e.what()));
  }
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    if (device.is_cuda()) {
#ifdef USE_C10D_NCCL
      c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).setDevice(device);
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = options.timeout;
      backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, env.rank, env.world_size, opts);
#else
      throw std::runtime_error("this LibTorch was built without NCCL (USE_C10D_NCCL)");
#endif
    } else {
      backend = make_gloo(store, env.rank, env.world_size, env.master_addr, options.timeout);
    }
  } catch (std::exception const& e) {
    throw CollectiveError(where + ": the " + std::string(device.is_cuda() ? "NCCL" : "Gloo") +
                          " process group did not come up: " + first_line(e.what()));
  }
  return std::make_shared<Collectives>(store, backend, device, options);
}

std::vector<std::shared_ptr<Collectives>> local_gloo_group(int count, CollectivesOptions options,
                                                           MakeCollectives const& make) {
  // torch's flight recorder (a per-process trace of collectives, for debugging hangs) adds a process group's status to
  // a map it shares between groups at the group's first collective without holding its lock (torch 2.11,
  // c10d::FlightRecorder::recordWithResetEnabled). One process per rank never races there; ranks as threads of one
  // process do, and crashed in the map's insert about once in 300 runs of a test that builds groups of 1-4 ranks. The
  // recorder reads its size once, when the first process group of the process is made: 0 turns it off.
  for (char const* name : {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}) ::setenv(name, "0", 1);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::shared_ptr<Collectives>> out(count);
  std::vector<std::string> errors(count);
  std::vector<std::thread> threads;
  for (int r = 0; r < count; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto backend = make_gloo(store, r, count, "127.0.0.1", options.timeout);
        out[r] = make ? make(store, backend, c10::Device(c10::kCPU), options)
                      : std::make_shared<Collectives>(store, backend, c10::Device(c10::kCPU), options);
      } catch (std::exception const& e) {
        errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < count; ++r) {
    if (!errors[r].empty()) throw CollectiveError("local Gloo group, rank " + std::to_string(r) + ": " + errors[r]);
  }
  return out;
}

}  // namespace fusepack::parallel
