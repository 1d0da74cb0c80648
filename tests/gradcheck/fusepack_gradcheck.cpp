// fusepack-gradcheck: the kernel developer's tool. Runs one op on any shape, forward and every gradient, and
// compares it with the fp64 reference:
//   --backend fused (default): the fused kernel on the GPU under the DESIGN section 5 rule, with the ATen composite
//     in the same dtype as baseline: max|fused − ref64| <= 2·max|composite − ref64| + one rounding step;
//   --backend composite: the composite itself on --device cpu|cuda in fp64 (allclose, 1e-10 relative: the two differ
//     only in operation order) or fp32 (relative RMS <= 1e-5, tests/support/torch_bridge.h says why).
// Prints one line per output and gradient (max abs, max rel, baseline error, share of the budget used) and exits 0
// only when all pass; 1 when a check fails; 2 for bad arguments.
#include "kernels/ops/attention.h"
#include "kernels/ops/conv1d.h"
#include "kernels/ops/gated_rmsnorm.h"
#include "kernels/ops/rmsnorm.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"
#include "reference/attention.h"
#include "reference/conv1d.h"
#include "reference/gated_rmsnorm.h"
#include "reference/rmsnorm.h"
#include "reference/rope.h"
#include "reference/swiglu.h"
#include "tests/support/compare.h"
#include "tests/support/dtype.h"
#include "tests/support/random.h"
#include "tests/support/torch_bridge.h"

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using ref::Tensor;

struct Options {
  std::string op;
  std::string dtype = "bf16";
  std::string backend = "fused";
  std::string device;  // default: cuda for fused, cpu for composite
  std::vector<int> seqlens{1, 17, 300};
  int heads = 4, kv_heads = 2, dim = 128, width = 4, rotary_dim = -1;
  bool silu = true, gate = true;
  double eps = 1e-6, theta = 1e7;
  std::uint64_t seed = 20261129;
};

// One op as the driver sees it: named inputs (all differentiable), the torch forward on a backend, and the fp64
// reference forward and backward.
struct OpSpec {
  std::vector<std::string> names;
  std::vector<Tensor> inputs;
  std::function<at::Tensor(std::vector<at::Tensor> const&, ops::Backend)> run;
  std::function<Tensor(std::vector<Tensor> const&)> ref_fwd;
  std::function<std::vector<Tensor>(Tensor const&, std::vector<Tensor> const&)> ref_bwd;
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
  std::int64_t const T = cu.back(), H = o.heads, D = o.dim;
  at::Tensor const cu_t = at::tensor(std::vector<int>(cu.begin(), cu.end()), at::kInt).to(device);
  OpSpec s;
  s.cu_seqlens = cu;
  if (o.op == "swiglu") {
    s.names = {"gate", "up"};
    s.inputs = {randn({T, D}, rng, 2.0), randn({T, D}, rng)};
    s.run = [](auto const& in, ops::Backend b) { return ops::swiglu(in[0], in[1], b); };
    s.ref_fwd = [](auto const& in) { return ref::swiglu_fwd(in[0], in[1]); };
    s.ref_bwd = [](Tensor const& dy, auto const& in) {
      auto g = ref::swiglu_bwd(dy, in[0], in[1]);
      return std::vector<Tensor>{g.dgate, g.dup};
    };
  } else if (o.op == "rmsnorm") {
    s.names = {"x", "weight"};
    s.inputs = {randn_rows_away_from_zero({T, H, D}, rng, 0.5), randn({D}, rng, 0.5)};
    s.run = [eps = o.eps](auto const& in, ops::Backend b) { return ops::rmsnorm(in[0], in[1], eps, b); };
    s.ref_fwd = [eps = o.eps](auto const& in) { return ref::rmsnorm_fwd(in[0], in[1], eps); };
    s.ref_bwd = [eps = o.eps](Tensor const& dy, auto const& in) {
      auto g = ref::rmsnorm_bwd(dy, in[0], in[1], eps);
      return std::vector<Tensor>{g.dx, g.dweight};
    };
  } else if (o.op == "gated_rmsnorm") {
    s.names = {"x", "z", "weight"};
    s.inputs = {randn_rows_away_from_zero({T, H, D}, rng, 0.5), randn({T, H, D}, rng, 2.0), randn({D}, rng, 0.5)};
    s.run = [eps = o.eps](auto const& in, ops::Backend b) { return ops::gated_rmsnorm(in[0], in[1], in[2], eps, b); };
    s.ref_fwd = [eps = o.eps](auto const& in) { return ref::gated_rmsnorm_fwd(in[0], in[1], in[2], eps); };
    s.ref_bwd = [eps = o.eps](Tensor const& dy, auto const& in) {
      auto g = ref::gated_rmsnorm_bwd(dy, in[0], in[1], in[2], eps);
      return std::vector<Tensor>{g.dx, g.dz, g.dweight};
    };
  } else if (o.op == "rope") {
    std::int64_t const r = o.rotary_dim > 0 ? o.rotary_dim : D;
    auto const pos = positions(cu);
    at::Tensor const pos_t = at::tensor(pos, at::kLong).to(device);
    s.names = {"x"};
    s.inputs = {randn({T, H, D}, rng)};
    s.run = [=, theta = o.theta](auto const& in, ops::Backend b) { return ops::rope(in[0], pos_t, r, theta, b); };
    s.ref_fwd = [=, theta = o.theta](auto const& in) { return ref::rope_fwd(in[0], pos, r, theta); };
    s.ref_bwd = [=, theta = o.theta](Tensor const& dy, auto const&) {
      return std::vector<Tensor>{ref::rope_bwd(dy, pos, r, theta)};
    };
  } else if (o.op == "conv1d") {
    s.names = {"x", "weight"};
    s.inputs = {randn({T, D}, rng), randn({D, o.width}, rng, 0.5)};
    s.run = [=, silu = o.silu](auto const& in, ops::Backend b) { return ops::conv1d(in[0], in[1], cu_t, silu, b); };
    s.ref_fwd = [=, silu = o.silu](auto const& in) { return ref::conv1d_fwd(in[0], in[1], cu, silu); };
    s.ref_bwd = [=, silu = o.silu](Tensor const& dy, auto const& in) {
      auto g = ref::conv1d_bwd(dy, in[0], in[1], cu, silu);
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
      return ops::attention(in[0], in[1], in[2], cu_t, max_len, scale, in.size() > 3 ? in[3] : at::Tensor(), b);
    };
    s.ref_fwd = [=](auto const& in) {
      return ref::attention_fwd(in[0], in[1], in[2], cu, scale, in.size() > 3 ? in[3] : Tensor());
    };
    s.ref_bwd = [=](Tensor const& dy, auto const& in) {
      auto g = ref::attention_bwd(dy, in[0], in[1], in[2], cu, scale, in.size() > 3 ? in[3] : Tensor());
      std::vector<Tensor> out{g.dq, g.dk, g.dv};
      if (in.size() > 3) out.push_back(g.dgate);
      return out;
    };
  } else {
    throw std::invalid_argument("unknown op '" + o.op +
                                "' (known: swiglu, rmsnorm, gated_rmsnorm, rope, conv1d, attention)");
  }
  return s;
}

struct Result {
  at::Tensor out;
  std::vector<at::Tensor> grads;
};

Result run_backend(OpSpec const& s, std::vector<at::Tensor> const& inputs, at::Tensor const& dy, ops::Backend b) {
  std::vector<at::Tensor> leaves;
  for (auto const& t : inputs) leaves.push_back(t.detach().clone().requires_grad_());
  at::Tensor out = s.run(leaves, b);
  return {out.detach(), torch::autograd::grad({out}, leaves, {dy})};
}

int gradcheck(Options const& o) {
  Dtype const dtype = o.dtype == "bf16" ? Dtype::kBF16 : o.dtype == "fp16" ? Dtype::kF16
                      : o.dtype == "fp32" ? Dtype::kF32 : o.dtype == "fp64" ? Dtype::kF64
                      : throw std::invalid_argument("--dtype must be bf16, fp16, fp32 or fp64; got " + o.dtype);
  std::vector<std::string> const known{"swiglu", "rmsnorm", "gated_rmsnorm", "rope", "conv1d", "attention"};
  if (std::find(known.begin(), known.end(), o.op) == known.end()) {
    throw std::invalid_argument("unknown op '" + o.op + "' (known: swiglu, rmsnorm, gated_rmsnorm, rope, conv1d, " +
                                "attention)");
  }
  ops::Backend const backend = ops::parse_backend(o.backend);
  std::string const device_name = o.device.empty() ? (backend == ops::Backend::kFused ? "cuda" : "cpu") : o.device;
  if (device_name != "cpu" && device_name != "cuda") throw std::invalid_argument("--device must be cpu or cuda");
  if (backend == ops::Backend::kComposite && dtype != Dtype::kF64 && dtype != Dtype::kF32) {
    throw std::invalid_argument("the composite is the baseline in bf16/fp16: check it with --dtype fp64 or fp32, or "
                                "check the fused kernel with --backend fused");
  }
  std::string why;
  if (device_name == "cuda" && !cuda_device_available(&why)) throw std::runtime_error(why);
  at::Device const device = device_name == "cuda" ? at::Device(at::kCUDA) : at::Device(at::kCPU);

  std::mt19937_64 rng(o.seed);
  OpSpec s = make_spec(o, rng, device);
  for (Tensor& t : s.inputs) round_to(dtype, t);
  Tensor const ref_out = s.ref_fwd(s.inputs);
  Tensor dy = randn(ref_out.shape(), rng);
  round_to(dtype, dy);
  std::vector<Tensor> const ref_grads = s.ref_bwd(dy, s.inputs);

  at::ScalarType const st = scalar_type(dtype);
  std::vector<at::Tensor> inputs;
  for (Tensor const& t : s.inputs) inputs.push_back(to_torch(t, st, device));
  at::Tensor const dy_t = to_torch(dy, st, device);
  Result const subject = run_backend(s, inputs, dy_t, backend);
  Result baseline;
  if (backend == ops::Backend::kFused) baseline = run_backend(s, inputs, dy_t, ops::Backend::kComposite);

  std::printf("fusepack-gradcheck %s: %s on %s, %s, seqlens", o.op.c_str(), o.backend.c_str(), device_name.c_str(),
              dtype_name(dtype));
  for (int l : o.seqlens) std::printf(" %d", l);
  std::printf(", seed %llu\n", static_cast<unsigned long long>(o.seed));
  auto check = [&](std::string const& name, at::Tensor const& got, at::Tensor const& base, Tensor const& want) {
    IndexLayout const layout = want.dim() >= 2 && want.size(0) == s.cu_seqlens.back() ? packed_layout(want, s.cu_seqlens)
                                                                                        : plain_layout(want);
    if (backend == ops::Backend::kFused) return check_fused(name, got, base, want, layout);
    // fp32: elementwise within 1e-5 of the tensor's largest magnitude, the same headroom as kFp32RelRms.
    double const scale = want.numel() ? want.flat().cwiseAbs().maxCoeff() : 0.0;
    ErrorReport r = compare_allclose(name + " " + dtype_name(dtype), to_ref(got), want,
                                     dtype == Dtype::kF64 ? Tolerance{1e-12, 1e-10} : Tolerance{kFp32RelRms * scale, 0},
                                     layout);
    if (dtype == Dtype::kF32 && r.rel_rms > kFp32RelRms) r.failed_bound = "rel_rms over the fp32 bound 1e-5";
    return r;
  };
  std::vector<ErrorReport> reports{check("out", subject.out, baseline.out, ref_out)};
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
}  // namespace fusepack::test

int main(int argc, char** argv) {
  fusepack::test::Options o;
  CLI::App app{"fusepack-gradcheck: one op, forward and every gradient, against the fp64 reference"};
  app.add_option("op", o.op, "swiglu | rmsnorm | gated_rmsnorm | rope | conv1d | attention")->required();
  app.add_option("--dtype", o.dtype, "bf16 | fp16 | fp32 | fp64")->capture_default_str();
  app.add_option("--backend", o.backend, "fused (checked against the composite baseline) | composite")
      ->capture_default_str();
  app.add_option("--device", o.device, "cpu | cuda (default: cuda for fused, cpu for composite)");
  app.add_option("--seqlens", o.seqlens, "example lengths of the packed batch, e.g. 1,17,1024")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--heads", o.heads, "heads (q heads for attention)")->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads, "attention key/value heads")->capture_default_str();
  app.add_option("--dim", o.dim, "channels, head dim or hidden size")->capture_default_str();
  app.add_option("--width", o.width, "conv1d width")->capture_default_str();
  app.add_option("--rotary-dim", o.rotary_dim, "rope: rotated channels (default: all)");
  app.add_flag("!--no-silu", o.silu, "conv1d without the fused SiLU");
  app.add_flag("!--no-gate", o.gate, "attention without the output gate");
  app.add_option("--seed", o.seed, "input seed")->capture_default_str();
  try {
    app.parse(argc, argv);
    return fusepack::test::gradcheck(o);
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
