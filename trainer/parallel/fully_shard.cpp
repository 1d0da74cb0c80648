#include "trainer/parallel/fully_shard.h"

#include "trainer/model/init.h"
#include "trainer/model/parameters.h"
#include "trainer/parallel/collectives.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace fusepack::parallel {
namespace {

constexpr std::int64_t kAlign = 16;  // bytes: every parameter's region starts aligned for any element type

std::int64_t align_up(std::int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::vector<std::int64_t> contiguous_strides(std::vector<std::int64_t> const& shape) {
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

// Gathered weights are freed and re-allocated in place (FSDP2's trick): the tensors the forward handed out, and the
// ones autograd saved from them, keep pointing at the same storage, whose bytes come and go.
void free_storage(at::Tensor const& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
}

void allocate_storage(at::Tensor const& t, std::int64_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(s->allocator()->allocate(static_cast<std::size_t>(nbytes)));
  s->set_nbytes(static_cast<std::size_t>(nbytes));
}

}  // namespace

struct ShardedParameter {
  std::string name;
  std::vector<std::int64_t> shape;
  ShardLayout layout;
  at::Tensor shard;                 // [local_rows, ...] master dtype: the trainable tensor
  at::ScalarType gather_dtype;      // what the forward reads it in
  std::int64_t element_size = 0;    // of gather_dtype
  std::int64_t in_offset = 0;       // bytes into a rank's all-gather input (the unit's shard)
  std::int64_t padded_bytes = 0;    // chunk_rows · row_numel · element_size: one rank's slice, padded
  std::int64_t out_offset = 0;      // bytes into the gathered (param-major) buffer
  std::int64_t reduce_offset = 0;   // elements into a rank's reduce-scatter output (the unit's padded gradient shard)
};

// One gather of a unit: its bytes (all ranks' slices, parameter after parameter) and the tensors handed out over them.
struct Gathered {
  at::Tensor flat;                  // uint8 [unit.gathered_bytes]; storage freed while resharded
  std::vector<at::Tensor> params;   // aliases of flat's storage (not views: set_), the unit's parameters in order
  bool allocated = false;
  std::optional<c10::Event> ready;  // CUDA: the copy-out on the all-gather stream is done
  std::vector<at::Tensor> scratch;  // buffers the all-gather stream uses until `ready`
};

struct Unit {
  std::string name;                           // "layer 3", "embedding and head"
  std::vector<model::WeightGroup> groups;
  std::vector<std::size_t> params;            // indices into Impl::params, in parameter_specs order
  std::int64_t shard_bytes = 0;               // one rank's all-gather input
  std::int64_t gathered_bytes = 0;
  std::int64_t reduce_numel = 0;              // one rank's reduce-scatter output (padded gradient shard)
  bool reshard_after_forward = true;
  std::shared_ptr<Gathered> live;             // gathered for the forward in progress
  std::shared_ptr<Gathered> prefetched;       // gathered ahead (CUDA)
  std::vector<bool> released;                 // per group of the forward in progress
  std::weak_ptr<Gathered> awaiting_backward;  // freed after the forward, to gather again in the backward
};

struct PendingReduction {
  std::size_t unit = 0;
  at::Tensor input, output;
  std::optional<c10::Event> done;
};

struct FullyShardedWeights::Impl {
  model::Qwen35Config config;
  std::shared_ptr<Collectives> comm;
  FullyShardOptions options;
  c10::Device device = c10::kCPU;
  int rank = 0, world = 1;
  std::vector<ShardedParameter> params;
  std::unordered_map<std::string, std::size_t> param_index;
  std::vector<Unit> units;
  std::map<std::pair<int, std::int64_t>, std::size_t> unit_of_group;  // (kind, layer) → unit
  std::optional<PendingReduction> pending;
  std::int64_t all_gathers = 0, reduce_scatters = 0;
  // CUDA only: the side streams and the compute stream they are ordered against.
  bool cuda = false;
  std::optional<c10::Stream> gather_stream, reduce_stream;

  std::size_t unit_index(model::WeightGroup const& g) const {
    auto const it = unit_of_group.find({static_cast<int>(g.kind), g.layer});
    if (it == unit_of_group.end()) throw std::invalid_argument("FullyShardedWeights: no unit holds " + g.str());
    return it->second;
  }

  c10::Stream compute_stream() const {
    return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
  }

  std::shared_ptr<Gathered> new_gathered(Unit const& u) {
    auto g = std::make_shared<Gathered>();
    g->flat = at::empty({u.gathered_bytes}, at::TensorOptions().dtype(at::kByte).device(device));
    g->allocated = true;
    at::NoGradGuard no_grad;
    for (std::size_t i : u.params) {
      ShardedParameter const& p = params[i];
      at::Tensor t = at::empty({0}, at::TensorOptions().dtype(p.gather_dtype).device(device));
      t.set_(g->flat.storage(), p.out_offset / p.element_size, p.shape, contiguous_strides(p.shape));
      g->params.push_back(std::move(t));
    }
    return g;
  }

  // Fills g (allocating its storage when freed) with every rank's slices of unit u. On CUDA the collective and the
  // copy-out run on the gather stream and g->ready marks their end; wait_ready orders the compute stream after it.
  void gather_into(Unit const& u, Gathered& g) {
    at::NoGradGuard no_grad;
    if (!g.allocated) {
      allocate_storage(g.flat, u.gathered_bytes);
      g.allocated = true;
    }
    at::Tensor in = at::empty({u.shard_bytes}, at::TensorOptions().dtype(at::kByte).device(device));
    // The shards, cast to their gather dtype, and the padding and alignment gaps zeroed, as a few list operations
    // (one copy per gather dtype, one fill) instead of two kernels per parameter.
    std::map<at::ScalarType, std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> casts;  // dst, src
    std::vector<at::Tensor> gaps;
    for (std::size_t i : u.params) {
      ShardedParameter const& p = params[i];
      std::int64_t const real = p.layout.local_numel() * p.element_size;
      if (real > 0) {
        auto& [dst, src] = casts[p.gather_dtype];
        dst.push_back(in.narrow(0, p.in_offset, real).view(p.gather_dtype));
        src.push_back(p.shard.reshape({-1}));
      }
      std::int64_t const gap = align_up(p.padded_bytes) - real;
      if (gap > 0) gaps.push_back(in.narrow(0, p.in_offset + real, gap));
    }
    for (auto& [dtype, lists] : casts) at::_foreach_copy_(lists.first, lists.second);
    if (!gaps.empty()) at::_foreach_zero_(gaps);
    // With one rank the rank-major all-gather buffer is already laid out parameter after parameter: the collective
    // writes the gathered weights in place.
    at::Tensor out = world == 1 ? g.flat : at::empty({u.shard_bytes * world}, in.options());
    auto collect = [&] {
      comm->all_gather(out, in, "all-gather of " + u.name);
      if (world == 1) return;
      at::Tensor const by_rank = out.view({world, u.shard_bytes});
      for (std::size_t i : u.params) {
        ShardedParameter const& p = params[i];
        g.flat.narrow(0, p.out_offset, world * p.padded_bytes)
            .view({world, p.padded_bytes})
            .copy_(by_rank.narrow(1, p.in_offset, p.padded_bytes));
      }
    };
    ++all_gathers;
    if (!cuda) {
      collect();
      return;
    }
    c10::Event copied_in(device.type());
    copied_in.record(compute_stream());
    {
      c10::StreamGuard on_gather(*gather_stream);
      copied_in.block(*gather_stream);
      collect();
      g.ready.emplace(device.type());
      g.ready->record(*gather_stream);
    }
    g.scratch = {in, out};  // allocated on the compute stream, used on the gather stream until `ready`
  }

  void wait_ready(Gathered& g) {
    if (!g.ready) return;
    g.ready->block(compute_stream());
    g.ready.reset();
    g.scratch.clear();  // the compute stream now runs after the gather stream's use of them
  }

  void release_storage(Gathered& g) {
    if (!g.allocated) return;
    wait_ready(g);
    free_storage(g.flat);
    g.allocated = false;
  }

  // Adds the reduce-scatter in flight to the shards' gradients (after the compute stream waited for it).
  void finish_pending() {
    if (!pending) return;
    if (pending->done) pending->done->block(compute_stream());
    at::NoGradGuard no_grad;
    Unit const& u = units[pending->unit];
    for (std::size_t i : u.params) {
      ShardedParameter& p = params[i];
      at::Tensor const g = pending->output.narrow(0, p.reduce_offset, p.layout.local_numel())
                               .view(local_shape(p.shape, p.layout))
                               .to(options.master_dtype);
      at::Tensor& grad = p.shard.mutable_grad();
      if (grad.defined()) {
        grad.add_(g);
      } else {
        grad = g;  // a view of the reduce-scatter's output (kept alive by it), or its conversion: no copy
      }
    }
    pending.reset();
  }

  // The backward of unit u's gather: every gradient of its parameters is complete.
  void reduce(std::size_t unit, std::shared_ptr<Gathered> const& gathered, torch::autograd::variable_list& grads) {
    finish_pending();  // at most one reduce-scatter in flight, as FSDP2
    Unit const& u = units[unit];
    at::ScalarType const reduce_dtype = options.mixed_precision.reduce(options.master_dtype);
    // Each gradient cut into world_size chunks of chunk_rows rows (zero-padded), chunk r of every parameter side by
    // side in row r: the layout whose row r reduce-scatters into rank r's padded shard of every parameter (FSDP2's
    // _chunk_cat). Converted to the reduce dtype on the way, by the copies that lay it out.
    at::Tensor input = at::empty({world, u.reduce_numel}, at::TensorOptions().dtype(reduce_dtype).device(device));
    for (std::size_t k = 0; k < u.params.size(); ++k) {
      ShardedParameter const& p = params[u.params[k]];
      std::int64_t const chunk = p.layout.padded_numel();
      std::int64_t const end = k + 1 < u.params.size() ? params[u.params[k + 1]].reduce_offset : u.reduce_numel;
      if (std::int64_t const gap = end - p.reduce_offset - chunk; gap > 0) {
        input.narrow(1, p.reduce_offset + chunk, gap).zero_();  // alignment, reduced with the rest
      }
      at::Tensor const by_rank = input.narrow(1, p.reduce_offset, chunk);  // [world, chunk]
      if (!grads[k].defined() || chunk == 0) {
        by_rank.zero_();
        continue;
      }
      at::Tensor const flat = grads[k].reshape({-1});
      std::int64_t const numel = flat.numel(), full = numel / chunk, rest = numel - full * chunk;
      if (full > 0) by_rank.narrow(0, 0, full).copy_(flat.narrow(0, 0, full * chunk).view({full, chunk}));
      if (full < world) {
        at::Tensor const partial = by_rank.select(0, full);
        if (rest > 0) partial.narrow(0, 0, rest).copy_(flat.narrow(0, full * chunk, rest));
        partial.narrow(0, rest, chunk - rest).zero_();
        if (full + 1 < world) by_rank.narrow(0, full + 1, world - full - 1).zero_();
      }
    }
    input = input.view({-1});
    grads.clear();
    release_storage(*gathered);  // nothing reads the gathered weights once their gradients are complete
    at::Tensor output = at::empty({u.reduce_numel}, input.options());
    PendingReduction r{unit, input, output, std::nullopt};
    ++reduce_scatters;
    if (!cuda) {
      comm->reduce_scatter_sum(output, input, "reduce-scatter of " + u.name);
    } else {
      c10::Event produced(device.type());
      produced.record(compute_stream());
      c10::StreamGuard on_reduce(*reduce_stream);
      produced.block(*reduce_stream);
      comm->reduce_scatter_sum(output, input, "reduce-scatter of " + u.name);
      r.done.emplace(device.type());
      r.done->record(*reduce_stream);
    }
    pending = std::move(r);
  }

  // The backward reached the output of unit u's forward: gather it again, and start the next one (reverse order).
  void gather_for_backward(std::size_t unit, std::shared_ptr<Gathered> const& g) {
    if (!g->allocated) gather_into(units[unit], *g);
    wait_ready(*g);
    if (!cuda || unit == 0) return;
    if (auto before = units[unit - 1].awaiting_backward.lock(); before && !before->allocated) {
      gather_into(units[unit - 1], *before);
    }
  }
};

namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

// The gathered weights' grad_fn: called by the autograd engine once every gradient of them is complete.
class GatherBackward final : public Node {
 public:
  GatherBackward(FullyShardedWeights::Impl* impl, std::size_t unit, std::shared_ptr<Gathered> gathered)
      : impl_(impl), unit_(unit), gathered_(std::move(gathered)) {}
  std::string name() const override { return "fusepack::FullyShardedWeights::GatherBackward"; }
  variable_list apply(variable_list&& grads) override {
    impl_->reduce(unit_, gathered_, grads);
    gathered_.reset();
    return {};
  }

 private:
  FullyShardedWeights::Impl* impl_;
  std::size_t unit_;
  std::shared_ptr<Gathered> gathered_;
};

}  // namespace

FullyShardedWeights::FullyShardedWeights(model::Qwen35Config config, std::shared_ptr<Collectives> comm,
                                         FullyShardOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  config.validate();
  m.config = std::move(config);
  m.comm = std::move(comm);
  m.options = options;
  m.device = m.comm->device();
  m.rank = m.comm->rank();
  m.world = m.comm->world_size();
  if (!at::isFloatingType(options.master_dtype) || at::elementSize(options.master_dtype) < 4) {
    throw std::invalid_argument(std::string("FullyShardedWeights: the master dtype must be fp32 or fp64; got ") +
                                c10::toString(options.master_dtype));
  }
  at::TensorOptions const master = at::TensorOptions().dtype(options.master_dtype).device(m.device);
  for (model::ParameterSpec const& spec : model::parameter_specs(m.config)) {
    ShardedParameter p;
    p.name = spec.name;
    p.shape = spec.shape;
    p.layout = ShardLayout::of(spec.shape, m.rank, m.world);
    p.shard = at::empty(local_shape(spec.shape, p.layout), master);
    p.shard.requires_grad_(true);
    p.gather_dtype = options.mixed_precision.compute_dtype(spec.name, options.master_dtype);
    p.element_size = static_cast<std::int64_t>(at::elementSize(p.gather_dtype));
    p.padded_bytes = p.layout.padded_numel() * p.element_size;
    m.param_index.emplace(p.name, m.params.size());
    m.params.push_back(std::move(p));
  }

  // Units: the embedding (with the head when tied), each layer, the head.
  at::ScalarType const reduce_dtype = options.mixed_precision.reduce(options.master_dtype);
  auto add_unit = [&](std::string name, std::vector<model::WeightGroup> groups, bool reshard) {
    Unit u;
    u.name = std::move(name);
    u.groups = std::move(groups);
    u.reshard_after_forward = reshard;
    std::vector<bool> in_unit(m.params.size(), false);
    for (model::WeightGroup const& g : u.groups) {
      for (std::string const& n : model::group_parameter_names(m.config, g)) in_unit[m.param_index.at(n)] = true;
      m.unit_of_group[{static_cast<int>(g.kind), g.layer}] = m.units.size();
    }
    for (std::size_t i = 0; i < m.params.size(); ++i) {
      if (!in_unit[i]) continue;
      ShardedParameter& p = m.params[i];
      p.in_offset = u.shard_bytes;
      u.shard_bytes += align_up(p.padded_bytes);
      p.out_offset = u.gathered_bytes;
      u.gathered_bytes += align_up(p.padded_bytes * m.world);
      // Each gradient shard starts 16-byte aligned, as a fresh allocation would: reductions over it (the grad norm)
      // then vectorize the same way and give the bits they give one process.
      std::int64_t const per_align = kAlign / static_cast<std::int64_t>(at::elementSize(reduce_dtype));
      p.reduce_offset = u.reduce_numel;
      u.reduce_numel += (p.layout.padded_numel() + per_align - 1) / per_align * per_align;
      u.params.push_back(i);
    }
    m.units.push_back(std::move(u));
  };
  bool const tied = m.config.tie_word_embeddings;
  // The head is the first unit the backward needs: kept from the forward (FSDP2's root default), as is a tied unit.
  add_unit(tied ? "embedding and head" : "embedding",
           tied ? std::vector<model::WeightGroup>{model::WeightGroup::embedding(), model::WeightGroup::head()}
                : std::vector<model::WeightGroup>{model::WeightGroup::embedding()},
           options.reshard_after_forward && !tied);
  for (std::int64_t i = 0; i < m.config.num_hidden_layers; ++i) {
    add_unit("layer " + std::to_string(i), {model::WeightGroup::decoder_layer(i)}, options.reshard_after_forward);
  }
  if (!tied) add_unit("head", {model::WeightGroup::head()}, false);

  m.cuda = m.device.is_cuda();
  if (m.cuda) {
    c10::impl::VirtualGuardImpl impl(m.device.type());
    m.gather_stream = impl.getStreamFromGlobalPool(m.device, /*isHighPriority=*/true);
    m.reduce_stream = impl.getStreamFromGlobalPool(m.device, /*isHighPriority=*/true);
  }
}

FullyShardedWeights::~FullyShardedWeights() = default;

void FullyShardedWeights::init_parameters(std::uint64_t seed) {
  at::NoGradGuard no_grad;
  std::vector<model::ParameterSpec> const specs = model::parameter_specs(impl_->config);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    ShardedParameter& p = impl_->params[i];
    model::init_parameter_rows(specs[i], impl_->config.initializer_range, seed, p.layout.begin, p.shard);
  }
}

void FullyShardedWeights::load_rows(RowReader const& read) {
  std::vector<at::Tensor> rows(impl_->params.size());
  std::vector<std::string> problems;
  for (std::size_t i = 0; i < impl_->params.size(); ++i) {
    ShardedParameter const& p = impl_->params[i];
    try {
      rows[i] = read(p.name, p.layout.begin, p.layout.end());
    } catch (std::exception const& e) {
      problems.push_back(e.what());
      continue;
    }
    if (rows[i].sizes() != p.shard.sizes()) {
      std::ostringstream os;
      os << p.name << ": rows [" << p.layout.begin << ", " << p.layout.end() << ") came as " << rows[i].sizes()
         << ", expected " << p.shard.sizes();
      problems.push_back(os.str());
    } else if (!at::isFloatingType(rows[i].scalar_type())) {
      problems.push_back(p.name + " is " + c10::toString(rows[i].scalar_type()) + ", not floating point");
    }
  }
  if (!problems.empty()) {
    std::string msg = "load_rows (rank " + std::to_string(impl_->rank) + "): ";
    for (std::size_t i = 0; i < problems.size() && i < 8; ++i) msg += (i ? "; " : "") + problems[i];
    if (problems.size() > 8) msg += "; and " + std::to_string(problems.size() - 8) + " more";
    throw std::invalid_argument(msg);
  }
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < impl_->params.size(); ++i) impl_->params[i].shard.copy_(rows[i]);
}

std::vector<optim::NamedParameter> FullyShardedWeights::parameters() const {
  std::vector<optim::NamedParameter> out;
  for (ShardedParameter const& p : impl_->params) out.push_back({p.name, p.shard});
  return out;
}

std::int64_t FullyShardedWeights::num_parameters() const {
  std::int64_t n = 0;
  for (ShardedParameter const& p : impl_->params) n += model::numel(p.shape);
  return n;
}

ShardLayout const& FullyShardedWeights::layout(std::string const& name) const {
  auto const it = impl_->param_index.find(name);
  if (it == impl_->param_index.end()) throw std::invalid_argument("FullyShardedWeights: no parameter '" + name + "'");
  return impl_->params[it->second].layout;
}

at::Tensor FullyShardedWeights::gather_parameter(std::string const& name) {
  auto const it = impl_->param_index.find(name);
  if (it == impl_->param_index.end()) throw std::invalid_argument("FullyShardedWeights: no parameter '" + name + "'");
  ShardedParameter const& p = impl_->params[it->second];
  at::NoGradGuard no_grad;
  at::Tensor in = at::zeros({p.layout.padded_numel()}, p.shard.options());
  in.narrow(0, 0, p.layout.local_numel()).copy_(p.shard.reshape({-1}));
  at::Tensor out = at::empty({p.layout.padded_numel() * impl_->world}, in.options());
  impl_->comm->all_gather(out, in, "all-gather of " + name);
  return out.narrow(0, 0, model::numel(p.shape)).view(p.shape);
}

model::GroupWeights FullyShardedWeights::acquire(model::WeightGroup const& group, bool recomputing) {
  Impl& m = *impl_;
  std::size_t const ui = m.unit_index(group);
  Unit& u = m.units[ui];
  if (!u.live) {
    if (u.prefetched) {
      u.live = std::move(u.prefetched);
    } else {
      u.live = m.new_gathered(u);
      m.gather_into(u, *u.live);
    }
    m.wait_ready(*u.live);
    u.released.assign(u.groups.size(), false);
    if (at::GradMode::is_enabled()) {
      auto node = std::shared_ptr<GatherBackward>(new GatherBackward(&m, ui, u.live), torch::autograd::deleteNode);
      for (at::Tensor& t : u.live->params) torch::autograd::create_gradient_edge(t, node);
    }
    // Start the next unit's all-gather now, so it overlaps this unit's compute (CUDA). Not in a recomputation: the
    // backward goes the other way, and its next unit was gathered long ago.
    if (m.cuda && !recomputing && ui + 1 < m.units.size() && !m.units[ui + 1].live && !m.units[ui + 1].prefetched) {
      Unit& next = m.units[ui + 1];
      next.prefetched = m.new_gathered(next);
      m.gather_into(next, *next.prefetched);
    }
  }
  model::GroupWeights out;
  for (std::string const& name : model::group_parameter_names(m.config, group)) {
    std::size_t const i = m.param_index.at(name);
    auto const pos = std::find(u.params.begin(), u.params.end(), i) - u.params.begin();
    out.emplace(name, u.live->params[static_cast<std::size_t>(pos)]);
  }
  return out;
}

void FullyShardedWeights::release(model::WeightGroup const& group, at::Tensor const& output, bool recomputing) {
  Impl& m = *impl_;
  std::size_t const ui = m.unit_index(group);
  Unit& u = m.units[ui];
  if (!u.live) throw std::logic_error("FullyShardedWeights::release: " + group.str() + " was not acquired");
  for (std::size_t k = 0; k < u.groups.size(); ++k) {
    if (u.groups[k] == group) u.released[k] = true;
  }
  if (std::find(u.released.begin(), u.released.end(), false) != u.released.end()) return;
  std::shared_ptr<Gathered> g = std::move(u.live);
  bool const backward = at::GradMode::is_enabled() && output.defined() && output.requires_grad();
  // Kept for the backward (its GatherBackward frees it): without resharding, or when this forward is activation
  // checkpointing's recomputation, whose backward comes next (FSDP2 skips its post-forward reshard there too).
  if ((!u.reshard_after_forward || recomputing) && backward) return;
  m.release_storage(*g);
  if (!backward) return;
  u.awaiting_backward = g;
  output.register_hook([&m, ui, g](at::Tensor const&) { m.gather_for_backward(ui, g); });
}

void FullyShardedWeights::finish_backward() {
  impl_->finish_pending();
  for (Unit& u : impl_->units) {
    u.awaiting_backward.reset();
    // A gather started for a forward that did not reach its unit (it threw) holds weights the optimizer is about to
    // change: never used.
    if (u.prefetched) {
      impl_->wait_ready(*u.prefetched);
      u.prefetched.reset();
    }
  }
}

c10::Device FullyShardedWeights::device() const { return impl_->device; }
std::int64_t FullyShardedWeights::all_gathers() const { return impl_->all_gathers; }
std::int64_t FullyShardedWeights::reduce_scatters() const { return impl_->reduce_scatters; }

}  // namespace fusepack::parallel
