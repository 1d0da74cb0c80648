// fusepack-gradcheck: the kernel developer's tool. Runs one op on any shape, forward and every gradient, and
// compares it with the fp64 reference:
//   --backend fused (default): the fused kernel on the GPU under the numerics rule of docs/contracts.md, with the
//     ATen composite in the same dtype as baseline: max|fused − ref64| <= 2·max|composite − ref64| + one rounding step;
//   --backend composite: the composite itself on --device cpu|cuda in fp64 (allclose, 1e-10 relative: the two differ
//     only in operation order) or fp32 (relative RMS <= 1e-5, verify/torch_bridge.h says why).
// gated_delta's decay g, initial and final states are fp32 whatever --dtype says (fp64 with --dtype fp64); in a
// bf16/fp16 run they are judged at that dtype's rounding step, like o (tests/kernels/gated_delta_test.cpp says why).
// Prints one line per output and gradient (max abs, max rel, baseline error, share of the budget used) and exits 0
// only when all pass; 1 when a check fails; 2 for bad arguments.
// --fused-only runs the fused forward and backward and nothing else (no composite, no reference, no check): the
// run for compute-sanitizer's initcheck, which instruments every kernel and would otherwise also judge the ATen and
// cuBLAS kernels of the composite baseline. With --digest it also prints a digest of every fused output's and
// gradient's bytes: the same digests from two builds mean bit-for-bit equal results (a refactor that must not change
// any rounding is checked this way).
#include "kernels/ops/attention.h"
#include "kernels/ops/conv1d.h"
#include "kernels/ops/gated_delta.h"
#include "kernels/ops/rmsnorm.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"
#include "reference/attention.h"
#include "reference/conv1d.h"
#include "reference/gated_delta.h"
#include "reference/gated_rmsnorm.h"
#include "reference/rmsnorm.h"
#include "reference/rope.h"
#include "reference/swiglu.h"
#include "verify/compare.h"
#include "verify/dtype.h"
#include "verify/random.h"
#include "verify/torch_bridge.h"

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fusepack::verify {
namespace {

using ref::Tensor;

struct Options {
  std::string op;
  std::string dtype = "bf16";
  std::string backend = "fused";
  std::string device;  // default: cuda for fused, cpu for composite
  std::vector<int> seqlens{1, 17, 300};
  std::vector<int> heads{4};  // gated_delta: Hk,Hv (one value: Hk = Hv)
  int kv_heads = 2, dim = 128, width = 4, rotary_dim = -1;
  bool silu = true, gate = true, l2norm = true, state = true, fused_only = false, digest = false;
  std::string schedule = "by-shape";  // gated_delta: by-shape | full | lean (gated_delta_schedule.h)
  double eps = 1e-6, theta = 1e7;
  std::uint64_t seed = 20261129;
};

// "--seqlens 1,17,300": each comma-separated item a decimal integer >= `min`; an empty item is an error (CLI11's own
// split read "1,,2" as 1 2).
std::vector<int> parse_list(char const* flag, std::string const& text, int min) {
  if (text.empty()) throw std::invalid_argument(std::string(flag) + " is empty: nothing to check");
  std::vector<int> out;
  std::size_t pos = 0;
  for (int item = 1;; ++item) {
    std::size_t const comma = std::min(text.find(',', pos), text.size());
    std::string const value = text.substr(pos, comma - pos);
    std::string const where = std::string(flag) + " " + text + ": item " + std::to_string(item);
    if (value.empty()) throw std::invalid_argument(where + " is empty (two commas in a row, or a comma at an end)");
    std::size_t const digits = value.find_first_not_of("0123456789", value[0] == '-' ? 1 : 0);
    if (digits != std::string::npos || value == "-" || value.size() > 10) {
      throw std::invalid_argument(where + " is '" + value + "', not an integer");
    }
    long long const v = std::stoll(value);
    if (v < min || v > 2147483647LL) {
      throw std::invalid_argument(where + " is " + value + "; it must be an integer >= " + std::to_string(min));
    }
    out.push_back(static_cast<int>(v));
    if (comma == text.size()) break;
    pos = comma + 1;
  }
  return out;
}

// The options that shape only some ops: one given for another op is an error, not silently ignored.
struct OptionScope {
  char const* option;
  std::vector<std::string> ops;
};
std::vector<OptionScope> const kOptionScopes = {
    {"--heads", {"rmsnorm", "gated_rmsnorm", "rope", "attention", "gated_delta"}},
    {"--kv-heads", {"attention"}},
    {"--width", {"conv1d"}},
    {"--rotary-dim", {"rope"}},
    {"--no-silu", {"conv1d"}},
    {"--no-gate", {"attention"}},
    {"--no-l2norm", {"gated_delta"}},
    {"--no-state", {"gated_delta"}},
    {"--schedule", {"gated_delta"}},
};

// Sizes whose tensors cannot be held: refused before anything is allocated (std::bad_alloc reached the user).
constexpr std::int64_t kMaxTensorElements = std::int64_t{1} << 30;  // 8 GiB as an fp64 reference tensor

void check_sizes(Options const& o) {
  std::int64_t tokens = 0, max_len = 0;
  for (int l : o.seqlens) {
    tokens += l;
    max_len = std::max<std::int64_t>(max_len, l);
  }
  if (tokens == 0) {
    throw std::invalid_argument("--seqlens " + std::to_string(o.seqlens.size()) +
                                " example(s), all empty: nothing to check (give a length >= 1)");
  }
  if (tokens > 2147483647LL) {
    throw std::invalid_argument("--seqlens add up to " + std::to_string(tokens) +
                                " tokens; cu_seqlens are int32: at most 2147483647");
  }
  std::int64_t heads = 1;
  for (int h : o.heads) heads = std::max<std::int64_t>(heads, h);
  if (o.op == "attention") heads = std::max<std::int64_t>(heads, o.kv_heads);
  bool const per_head = o.op != "swiglu" && o.op != "conv1d";
  std::int64_t const largest = tokens * (per_head ? heads : 1) * o.dim;
  std::int64_t const state = o.op == "gated_delta" && o.state
                                 ? static_cast<std::int64_t>(o.seqlens.size()) * heads * o.dim * o.dim
                                 : 0;
  if (std::max(largest, state) > kMaxTensorElements) {
    throw std::invalid_argument("--seqlens (" + std::to_string(tokens) + " tokens), --heads " +
                                std::to_string(per_head ? heads : 1) + " and --dim " + std::to_string(o.dim) +
                                " ask for a tensor of " + std::to_string(std::max(largest, state)) +
                                " elements; at most " + std::to_string(kMaxTensorElements) +
                                " (2^30, 8 GiB in fp64) are allowed");
  }
}

// The fp64 reference runs on one CPU core: a note before a long one, so a large run is not mistaken for a hang.
double reference_flops(Options const& o) {
  double flops = 0;
  double const H = o.heads.empty() ? 1 : o.heads.back(), D = o.dim;
  for (int l : o.seqlens) {
    double const L = l;
    if (o.op == "attention") flops += 8 * (L * (L + 1) / 2) * H * D;  // QK^T and PV, forward and backward
    else if (o.op == "gated_delta") flops += 12 * L * H * D * D;     // the state update and its gradient
    else flops += 20 * L * H * D;
  }
  return flops;
}

using Outs = std::vector<at::Tensor>;
using Refs = std::vector<Tensor>;

// One op as the driver sees it: named inputs (all differentiable), named outputs, the torch forward on a backend, and
// the fp64 reference forward and backward (the gradient of Σ dout_i·out_i with respect to every input).
struct OpSpec {
  std::vector<std::string> names;
  std::vector<Tensor> inputs;
  std::vector<std::string> out_names{"out"};
  std::set<std::string> fp32_tensors;  // inputs and outputs held in fp32 (fp64 in fp64 runs) whatever --dtype says
  std::function<Outs(Outs const&, ops::Backend)> run;
  std::function<Refs(Refs const&)> ref_fwd;
  std::function<Refs(Refs const& dout, Refs const& in)> ref_bwd;
  std::vector<std::int32_t> cu_seqlens;  // for decoding the worst index; empty when the op has no tokens
};

std::vector<std::int64_t> positions(std::vector<std::int32_t> const& cu) {
  std::vector<std::int64_t> pos;
  for (size_t e = 0; e + 1 < cu.size(); ++e)
    for (std::int32_t t = cu[e]; t < cu[e + 1]; ++t) pos.push_back(t - cu[e]);
  return pos;
}

OpSpec make_spec(Options const& o, std::mt19937_64& rng, at::Device device) {
  std::vector<std::int32_t> const cu = cu_seqlens_from_lengths(o.seqlens);
  std::int64_t const T = cu.back(), H = o.heads[0], D = o.dim;
  if (o.op != "gated_delta" && o.heads.size() != 1) {
    throw std::invalid_argument("--heads takes one value for " + o.op + " (two, Hk,Hv, for gated_delta)");
  }
  at::Tensor const cu_t = at::tensor(std::vector<int>(cu.begin(), cu.end()), at::kInt).to(device);
  OpSpec s;
  s.cu_seqlens = cu;
  if (o.op == "swiglu") {
    s.names = {"gate", "up"};
    s.inputs = {randn({T, D}, rng, 2.0), randn({T, D}, rng)};
    s.run = [](auto const& in, ops::Backend b) { return Outs{ops::swiglu(in[0], in[1], b)}; };
    s.ref_fwd = [](auto const& in) { return Refs{ref::swiglu_fwd(in[0], in[1])}; };
    s.ref_bwd = [](Refs const& dy, auto const& in) {
      auto g = ref::swiglu_bwd(dy[0], in[0], in[1]);
      return std::vector<Tensor>{g.dgate, g.dup};
    };
  } else if (o.op == "rmsnorm") {
    s.names = {"x", "weight"};
    s.inputs = {randn_rows_away_from_zero({T, H, D}, rng, 0.5), randn({D}, rng, 0.5)};
    s.run = [eps = o.eps](auto const& in, ops::Backend b) { return Outs{ops::rmsnorm(in[0], in[1], eps, b)}; };
    s.ref_fwd = [eps = o.eps](auto const& in) { return Refs{ref::rmsnorm_fwd(in[0], in[1], eps)}; };
    s.ref_bwd = [eps = o.eps](Refs const& dy, auto const& in) {
      auto g = ref::rmsnorm_bwd(dy[0], in[0], in[1], eps);
      return std::vector<Tensor>{g.dx, g.dweight};
    };
  } else if (o.op == "gated_rmsnorm") {
    s.names = {"x", "z", "weight"};
    s.inputs = {randn_rows_away_from_zero({T, H, D}, rng, 0.5), randn({T, H, D}, rng, 2.0), randn({D}, rng, 0.5)};
    s.run = [eps = o.eps](auto const& in, ops::Backend b) {
      return Outs{ops::gated_rmsnorm(in[0], in[1], in[2], eps, b)};
    };
    s.ref_fwd = [eps = o.eps](auto const& in) { return Refs{ref::gated_rmsnorm_fwd(in[0], in[1], in[2], eps)}; };
    s.ref_bwd = [eps = o.eps](Refs const& dy, auto const& in) {
      auto g = ref::gated_rmsnorm_bwd(dy[0], in[0], in[1], in[2], eps);
      return std::vector<Tensor>{g.dx, g.dz, g.dweight};
    };
  } else if (o.op == "rope") {
    std::int64_t const r = o.rotary_dim > 0 ? o.rotary_dim : D;
    auto const pos = positions(cu);
    at::Tensor const pos_t = at::tensor(pos, at::kLong).to(device);
    s.names = {"x"};
    s.inputs = {randn({T, H, D}, rng)};
    s.run = [=, theta = o.theta](auto const& in, ops::Backend b) {
      return Outs{ops::rope(in[0], pos_t, r, theta, b)};
    };
    s.ref_fwd = [=, theta = o.theta](auto const& in) { return Refs{ref::rope_fwd(in[0], pos, r, theta)}; };
    s.ref_bwd = [=, theta = o.theta](Refs const& dy, auto const&) {
      return std::vector<Tensor>{ref::rope_bwd(dy[0], pos, r, theta)};
    };
  } else if (o.op == "conv1d") {
    s.names = {"x", "weight"};
    s.inputs = {randn({T, D}, rng), randn({D, o.width}, rng, 0.5)};
    s.run = [=, silu = o.silu](auto const& in, ops::Backend b) {
      return Outs{ops::conv1d(in[0], in[1], cu_t, silu, b)};
    };
    s.ref_fwd = [=, silu = o.silu](auto const& in) { return Refs{ref::conv1d_fwd(in[0], in[1], cu, silu)}; };
    s.ref_bwd = [=, silu = o.silu](Refs const& dy, auto const& in) {
      auto g = ref::conv1d_bwd(dy[0], in[0], in[1], cu, silu);
      return std::vector<Tensor>{g.dx, g.dweight};
    };
  } else if (o.op == "attention") {
    std::int64_t const Hkv = o.kv_heads;
    std::int64_t max_len = 0;
    for (int l : o.seqlens) max_len = std::max<std::int64_t>(max_len, l);
    double const scale = 1.0 / std::sqrt(static_cast<double>(D));
    s.names = {"q", "k", "v"};
    s.inputs = {randn({T, H, D}, rng), randn({T, Hkv, D}, rng), randn({T, Hkv, D}, rng)};
    if (o.gate) {
      s.names.push_back("gate");
      s.inputs.push_back(randn({T, H, D}, rng, 2.0));
    }
    s.run = [=](auto const& in, ops::Backend b) {
      return Outs{ops::attention(in[0], in[1], in[2], cu_t, max_len, scale, in.size() > 3 ? in[3] : at::Tensor(), b)};
    };
    s.ref_fwd = [=](auto const& in) {
      return Refs{ref::attention_fwd(in[0], in[1], in[2], cu, scale, in.size() > 3 ? in[3] : Tensor())};
    };
    s.ref_bwd = [=](Refs const& dy, auto const& in) {
      auto g = ref::attention_bwd(dy[0], in[0], in[1], in[2], cu, scale, in.size() > 3 ? in[3] : Tensor());
      std::vector<Tensor> out{g.dq, g.dk, g.dv};
      if (in.size() > 3) out.push_back(g.dgate);
      return out;
    };
  } else if (o.op == "gated_delta") {
    if (o.heads.empty() || o.heads.size() > 2) throw std::invalid_argument("--heads for gated_delta is Hk or Hk,Hv");
    std::int64_t const Hk = o.heads[0], Hv = o.heads.back(), N = static_cast<std::int64_t>(o.seqlens.size());
    if (Hk < 1 || Hv % Hk != 0) {
      throw std::invalid_argument("--heads Hk,Hv: Hv=" + std::to_string(Hv) + " must be a positive multiple of Hk=" +
                                  std::to_string(Hk));
    }
    double const scale = 1.0 / std::sqrt(static_cast<double>(D));
    bool const l2 = o.l2norm, state = o.state;
    if (o.schedule != "by-shape" && ops::parse_backend(o.backend) != ops::Backend::kFused) {
      throw std::invalid_argument("--schedule " + o.schedule + " chooses the fused kernels' schedule; got --backend " +
                                  o.backend);
    }
    GatedDeltaSchedule const schedule = o.schedule == "full"   ? GatedDeltaSchedule::kFullChain
                                        : o.schedule == "lean" ? GatedDeltaSchedule::kLeanChain
                                                               : GatedDeltaSchedule::kByShape;
    // As the model feeds it: β in (0, 1), g in [−0.05, 0] (the state carried across a 64-token chunk stays ~0.2);
    // without the l2 norm q and k of unit expected norm.
    double const qk_std = l2 ? 1.0 : 1.0 / std::sqrt(static_cast<double>(D));
    s.names = {"q", "k", "v", "g", "beta"};
    s.inputs = {randn({T, Hk, D}, rng, qk_std), randn({T, Hk, D}, rng, qk_std), randn({T, Hv, D}, rng),
                uniform({T, Hv}, rng, -0.05, 0.0), uniform({T, Hv}, rng, 0.0, 1.0)};
    s.fp32_tensors = {"g", "initial_state", "final_state"};
    s.out_names = {"o"};
    if (state) {
      s.names.push_back("initial_state");
      s.inputs.push_back(randn({N, Hv, D, D}, rng, 0.5));
      s.out_names.push_back("final_state");
    }
    s.run = [=](auto const& in, ops::Backend b) {
      auto r = ops::gated_delta(in[0], in[1], in[2], in[3], in[4], cu_t, scale, l2, b,
                                state ? in[5] : at::Tensor(), state,
                                b == ops::Backend::kFused ? schedule : GatedDeltaSchedule::kByShape);
      return state ? Outs{r.o, r.final_state} : Outs{r.o};
    };
    s.ref_fwd = [=](auto const& in) {
      auto r = ref::gated_delta_fwd(in[0], in[1], in[2], in[3], in[4], cu, scale, l2, state ? in[5] : Tensor(), state);
      return state ? Refs{r.o, r.final_state} : Refs{r.o};
    };
    s.ref_bwd = [=](Refs const& dy, auto const& in) {
      auto g = ref::gated_delta_bwd(dy[0], state ? dy[1] : Tensor(), in[0], in[1], in[2], in[3], in[4], cu, scale, l2,
                                    state ? in[5] : Tensor());
      std::vector<Tensor> out{g.dq, g.dk, g.dv, g.dg, g.dbeta};
      if (state) out.push_back(g.dinitial_state);
      return out;
    };
  } else {
    throw std::invalid_argument("unknown op '" + o.op +
                                "' (known: swiglu, rmsnorm, gated_rmsnorm, rope, conv1d, attention, gated_delta)");
  }
  return s;
}

struct Result {
  std::vector<at::Tensor> outs;
  std::vector<at::Tensor> grads;
};

Result run_backend(OpSpec const& s, std::vector<at::Tensor> const& inputs, std::vector<at::Tensor> const& dys,
                   ops::Backend b) {
  std::vector<at::Tensor> leaves;
  for (auto const& t : inputs) leaves.push_back(t.detach().clone().requires_grad_());
  std::vector<at::Tensor> const outs = s.run(leaves, b);
  Result r{{}, torch::autograd::grad(outs, leaves, dys)};
  for (auto const& out : outs) r.outs.push_back(out.detach());
  return r;
}

// The dtype of input or output `name` in a run of `dtype`: the op's fp32 tensors stay fp32 (fp64 in fp64 runs).
Dtype tensor_dtype(OpSpec const& s, Dtype dtype, std::string const& name) {
  if (!s.fp32_tensors.count(name)) return dtype;
  return dtype == Dtype::kF64 ? Dtype::kF64 : Dtype::kF32;
}

// A tensor's bytes as a 64-bit FNV-1a digest, with its dtype and shape: equal digests of two builds' runs mean the
// same bits (a different digest, some bit differs; the tensors' checks say by how much).
void print_digest(std::string const& name, at::Tensor const& t) {
  if (!t.defined()) {
    std::printf("  %s: undefined\n", name.c_str());
    return;
  }
  at::Tensor const host = t.detach().contiguous().to(at::kCPU);
  auto const* bytes = static_cast<unsigned char const*>(host.data_ptr());
  std::uint64_t h = 14695981039346656037ull;
  for (std::size_t i = 0, n = host.numel() * host.element_size(); i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  std::string shape;
  for (std::int64_t d : host.sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  std::printf("  %s %s [%s]: digest %016llx\n", name.c_str(), dtype_name(test_dtype(host.scalar_type())),
              shape.c_str(), static_cast<unsigned long long>(h));
}

// The inputs drawn as for a check (not rounded: nothing is compared), the fused op forward and backward; with
// --digest, every output's and gradient's digest.
int run_fused_only(Options const& o, OpSpec const& s, Dtype dtype, at::Device device, std::mt19937_64& rng) {
  if (ops::parse_backend(o.backend) != ops::Backend::kFused) {
    throw std::invalid_argument("--fused-only runs the fused backend; got --backend " + o.backend);
  }
  auto type_of = [&](std::string const& name) { return scalar_type(tensor_dtype(s, dtype, name)); };
  std::vector<at::Tensor> inputs, dys;
  for (size_t i = 0; i < s.inputs.size(); ++i) inputs.push_back(to_torch(s.inputs[i], type_of(s.names[i]), device));
  std::vector<at::Tensor> leaves;
  for (auto const& t : inputs) leaves.push_back(t.detach().clone().requires_grad_());
  std::vector<at::Tensor> const outs = s.run(leaves, ops::Backend::kFused);
  for (size_t i = 0; i < outs.size(); ++i) {
    dys.push_back(to_torch(randn(ref::Shape(outs[i].sizes().begin(), outs[i].sizes().end()), rng),
                           type_of(s.out_names[i]), device));
  }
  std::vector<at::Tensor> const grads = torch::autograd::grad(outs, leaves, dys);
  for (at::Tensor const& g : grads) (void)g.to(at::kCPU);  // waits for the device: a kernel fault surfaces here
  // The forward again without gradients: the kernels a model runs for inference, which save nothing for a backward
  // (and may hand intermediate results over in another form), so that sanitizers see them too.
  std::vector<at::Tensor> inferred;
  {
    c10::NoGradGuard no_grad;
    inferred = s.run(inputs, ops::Backend::kFused);
  }
  for (at::Tensor const& t : inferred) (void)t.to(at::kCPU);
  std::printf("fusepack-gradcheck %s: fused only on %s, %s: %zu outputs and %zu gradients computed, and the outputs "
              "again without gradients; none checked (run without --fused-only to check them)\n",
              o.op.c_str(), device.str().c_str(), dtype_name(dtype), outs.size(), grads.size());
  if (o.digest) {
    for (size_t i = 0; i < outs.size(); ++i) print_digest(s.out_names[i], outs[i]);
    for (size_t i = 0; i < grads.size(); ++i) print_digest("d" + s.names[i], grads[i]);
    for (size_t i = 0; i < inferred.size(); ++i) print_digest(s.out_names[i] + " (no grad)", inferred[i]);
  }
  return 0;
}

int gradcheck(Options const& o) {
  Dtype const dtype = o.dtype == "bf16" ? Dtype::kBF16 : o.dtype == "fp16" ? Dtype::kF16
                      : o.dtype == "fp32" ? Dtype::kF32 : o.dtype == "fp64" ? Dtype::kF64
                      : throw std::invalid_argument("--dtype must be bf16, fp16, fp32 or fp64; got " + o.dtype);
  std::vector<std::string> const known{"swiglu", "rmsnorm", "gated_rmsnorm", "rope", "conv1d", "attention",
                                       "gated_delta"};
  if (std::find(known.begin(), known.end(), o.op) == known.end()) {
    throw std::invalid_argument("unknown op '" + o.op + "' (known: swiglu, rmsnorm, gated_rmsnorm, rope, conv1d, " +
                                "attention, gated_delta)");
  }
  check_sizes(o);  // before any device is touched
  ops::Backend const backend = ops::parse_backend(o.backend);
  std::string const device_name = o.device.empty() ? (backend == ops::Backend::kFused ? "cuda" : "cpu") : o.device;
  if (device_name != "cpu" && device_name != "cuda") throw std::invalid_argument("--device must be cpu or cuda");
  if (backend == ops::Backend::kComposite && dtype != Dtype::kF64 && dtype != Dtype::kF32) {
    throw std::invalid_argument("the composite is the baseline in bf16/fp16: check it with --dtype fp64 or fp32, or "
                                "check the fused kernel with --backend fused");
  }
  std::string why;
  if (device_name == "cuda" && !cuda_device_available(&why)) {
    throw std::runtime_error(why + " (the fused kernels need one; on this machine check the composite on the CPU: "
                                   "--backend composite --dtype fp64)");
  }
  at::Device const device = device_name == "cuda" ? at::Device(at::kCUDA) : at::Device(at::kCPU);

  double const flops = reference_flops(o);
  bool const slow = flops > 2e10;  // about ten seconds of fp64 loops on one core
  if (slow) {
    // The reference's plain loops run at about 1 GFLOP/s.
    std::fprintf(stderr,
                 "fusepack-gradcheck: the fp64 reference of %s at this size is about %.0f GFLOP on one CPU core: "
                 "expect about %.0f minutes; progress follows\n",
                 o.op.c_str(), flops / 1e9, std::ceil(flops / 1e9 / 60));
  }
  auto const started = std::chrono::steady_clock::now();
  auto progress = [&](char const* what) {
    if (!slow) return;
    double const s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::fprintf(stderr, "fusepack-gradcheck: %s (%.0f s)\n", what, s);
  };

  std::mt19937_64 rng(o.seed);
  OpSpec s = make_spec(o, rng, device);
  if (o.fused_only) return run_fused_only(o, s, dtype, device, rng);
  // Every tensor rounded to what the op receives, so the reference sees exactly the kernel's inputs.
  auto dtype_of = [&](std::string const& name) { return tensor_dtype(s, dtype, name); };
  for (size_t i = 0; i < s.inputs.size(); ++i) round_to(dtype_of(s.names[i]), s.inputs[i]);
  progress("fp64 reference forward");
  Refs const ref_outs = s.ref_fwd(s.inputs);
  Refs dys;
  for (size_t i = 0; i < ref_outs.size(); ++i) {
    dys.push_back(randn(ref_outs[i].shape(), rng));
    round_to(dtype_of(s.out_names[i]), dys.back());
  }
  progress("fp64 reference backward");
  std::vector<Tensor> const ref_grads = s.ref_bwd(dys, s.inputs);
  progress("the op under test");

  std::vector<at::Tensor> inputs, dys_t;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    inputs.push_back(to_torch(s.inputs[i], scalar_type(dtype_of(s.names[i])), device));
  }
  for (size_t i = 0; i < dys.size(); ++i) {
    dys_t.push_back(to_torch(dys[i], scalar_type(dtype_of(s.out_names[i])), device));
  }
  Result const subject = run_backend(s, inputs, dys_t, backend);
  Result baseline;
  if (backend == ops::Backend::kFused) baseline = run_backend(s, inputs, dys_t, ops::Backend::kComposite);

  std::printf("fusepack-gradcheck %s: %s on %s, %s, seqlens", o.op.c_str(), o.backend.c_str(), device_name.c_str(),
              dtype_name(dtype));
  for (int l : o.seqlens) std::printf(" %d", l);
  std::printf(", seed %llu\n", static_cast<unsigned long long>(o.seed));
  auto check = [&](std::string const& name, at::Tensor const& got, at::Tensor const& base, Tensor const& want) {
    IndexLayout const layout = want.dim() >= 2 && want.size(0) == s.cu_seqlens.back() ? packed_layout(want, s.cu_seqlens)
                                                                                        : plain_layout(want);
    if (backend == ops::Backend::kFused && got.scalar_type() != scalar_type(dtype)) {
      // an fp32 output of a bf16/fp16 run: the floor is one rounding step of the run's dtype, as for the others
      Tensor const g = to_ref(got), b = to_ref(base);
      double const floor = rounding_step(dtype, want.numel() ? want.flat().cwiseAbs().maxCoeff() : 0.0);
      return compare_with_baseline(name + " fp32 of a " + dtype_name(dtype) + " run", g.data(), b.data(), want.data(),
                                   want.numel(), floor, layout);
    }
    if (backend == ops::Backend::kFused) return check_fused(name, got, base, want, layout);
    // fp32: elementwise within 1e-5 of the tensor's largest magnitude, the same headroom as kFp32RelRms.
    double const scale = want.numel() ? want.flat().cwiseAbs().maxCoeff() : 0.0;
    ErrorReport r = compare_allclose(name + " " + dtype_name(dtype), to_ref(got), want,
                                     dtype == Dtype::kF64 ? Tolerance{1e-12, 1e-10} : Tolerance{kFp32RelRms * scale, 0},
                                     layout);
    if (dtype == Dtype::kF32 && r.rel_rms > kFp32RelRms) r.failed_bound = "rel_rms over the fp32 bound 1e-5";
    return r;
  };
  std::vector<ErrorReport> reports;
  for (size_t i = 0; i < s.out_names.size(); ++i) {
    reports.push_back(check(s.out_names[i], subject.outs[i],
                            backend == ops::Backend::kFused ? baseline.outs[i] : at::Tensor(), ref_outs[i]));
  }
  for (size_t i = 0; i < s.names.size(); ++i) {
    reports.push_back(check("d" + s.names[i], subject.grads[i], backend == ops::Backend::kFused ? baseline.grads[i]
                                                                                                : at::Tensor(),
                            ref_grads[i]));
  }
  int failed = 0;
  for (ErrorReport const& r : reports) {
    std::printf("  %s\n", r.str().c_str());
    failed += !r.passed();
  }
  std::printf("%zu passed, %d failed\n", reports.size() - failed, failed);
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace fusepack::verify

int main(int argc, char** argv) {
  fusepack::verify::Options o;
  std::string seqlens = "1,17,300", heads = "4";
  CLI::App app{"fusepack-gradcheck: one op, forward and every gradient, against the fp64 reference"};
  app.add_option("op", o.op, "swiglu | rmsnorm | gated_rmsnorm | rope | conv1d | attention | gated_delta")
      ->required();
  app.add_option("--dtype", o.dtype, "bf16 | fp16 | fp32 | fp64")->capture_default_str();
  app.add_option("--backend", o.backend, "fused (checked against the composite baseline) | composite")
      ->capture_default_str();
  app.add_option("--device", o.device, "cpu | cuda (default: cuda for fused, cpu for composite)");
  app.add_option("--seqlens", seqlens, "example lengths of the packed batch, e.g. 1,17,1024")->capture_default_str();
  app.add_option("--heads", heads, "heads (q heads for attention; Hk,Hv for gated_delta)")->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads, "attention key/value heads")->capture_default_str();
  app.add_option("--dim", o.dim, "channels, head dim or hidden size (gated_delta: K = V)")->capture_default_str();
  app.add_option("--width", o.width, "conv1d width")->capture_default_str();
  app.add_option("--rotary-dim", o.rotary_dim, "rope: rotated channels (default: all)");
  CLI::Option* const fused_only = app.add_flag(
      "--fused-only", o.fused_only,
      "run the fused forward and backward only, check nothing (for compute-sanitizer's initcheck)");
  app.add_flag("--digest", o.digest,
               "with --fused-only: print a digest of every output's and gradient's bytes, so that two builds can be "
               "compared bit for bit")
      ->needs(fused_only);
  app.add_flag("!--no-silu", o.silu, "conv1d without the fused SiLU");
  app.add_flag("!--no-gate", o.gate, "attention without the output gate");
  app.add_flag("!--no-l2norm", o.l2norm, "gated_delta without the q/k l2 norm");
  app.add_flag("!--no-state", o.state, "gated_delta without initial and final state");
  app.add_option("--schedule", o.schedule,
                 "gated_delta's fused schedule: by-shape (the launchers pick) | full | lean (the chain kernels do only "
                 "the state work, for few long examples)")
      ->capture_default_str()
      ->check(CLI::IsMember({"by-shape", "full", "lean"}));
  // A seed is unsigned; CLI11 reads "-1" as 2^64 - 1, so a sign is refused before it converts.
  app.add_option("--seed", o.seed, "input seed")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) {
            return text.find('-') == std::string::npos
                       ? std::string()
                       : "must be a non-negative integer (0 to 2^64-1); got " + text;
          },
          "UINT64"));
  try {
    app.parse(argc, argv);
    for (fusepack::verify::OptionScope const& scope : fusepack::verify::kOptionScopes) {
      if (app.count(scope.option) == 0) continue;
      if (std::find(scope.ops.begin(), scope.ops.end(), o.op) != scope.ops.end()) continue;
      std::string ops;
      for (std::string const& op : scope.ops) ops += (ops.empty() ? "" : ", ") + op;
      throw std::invalid_argument(std::string(scope.option) + " does not apply to " + o.op + " (it applies to " +
                                  ops + ")");
    }
    o.seqlens = fusepack::verify::parse_list("--seqlens", seqlens, 0);
    o.heads = fusepack::verify::parse_list("--heads", heads, 1);
    for (auto [flag, value] : {std::pair<char const*, int>{"--dim", o.dim}, {"--kv-heads", o.kv_heads},
                               {"--width", o.width}}) {
      if (value < 1) {
        throw std::invalid_argument(std::string(flag) + " must be >= 1; got " + std::to_string(value) +
                                    (std::string(flag) == "--dim" ? ": nothing to check" : ""));
      }
    }
    return fusepack::verify::gradcheck(o);
  } catch (CLI::ParseError const& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (c10::Error const& e) {
    std::fprintf(stderr, "fusepack-gradcheck: %s\n", e.what_without_backtrace());
    return 2;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "fusepack-gradcheck: %s\n", e.what());
    return 2;
  }
}
