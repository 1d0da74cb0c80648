#include "kernels/bench/bench.h"
#include "kernels/gated_delta/gated_delta_trace.h"
#include "kernels/ops/gated_delta.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nvtx3/nvToolsExt.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace fusepack::bench {

namespace {

constexpr int64_t kD = 128, kChunk = 64;  // K = V = kD

struct GatedDeltaShape {
  int64_t Hk, Hv, examples, T;  // T tokens in all, as `examples` examples of T / examples tokens each
  std::vector<int> lengths = {};  // or examples of these lengths (summing to T), when given
  std::vector<int> example_lengths() const {
    return lengths.empty() ? std::vector<int>(static_cast<std::size_t>(examples), static_cast<int>(T / examples))
                           : lengths;
  }
};

// A training pack of Qwen3.5-0.8B's Gated DeltaNet (16 key and 16 value heads): nine examples filling 8,192 tokens,
// the longest 2,840, as the trainer's benchmark packs its log-normal lengths (median 900); the longest example's chain
// bounds the pack's time.
GatedDeltaShape const kTrainingPack{16, 16, 9, 8192, {2840, 415, 1210, 655, 980, 301, 760, 532, 499}};

// The two forced forward schedules, each timed on every shape next to the launcher's pick.
constexpr GatedDeltaSchedule kForcedSchedules[] = {GatedDeltaSchedule::kFullChain,
                                                   GatedDeltaSchedule::kLeanChain};

// FLOPs of the chunked algorithm's matrix products, per chunk of C tokens and value head (K = V = d):
//   k̂k̂ᵀ, q̂k̂ᵀ: 2·2C²d;  (I + A)⁻¹ by substitution: 2C³/3;  w = A⁻¹(βe^G k̂), u = A⁻¹(βv): 2·2C²d;
//   v_new = u − w·h, q̂e^G·h, h += (k̂e^(G_C−G))ᵀ·v_new: 3·2Cd²;  (M ⊙ q̂k̂ᵀe^ΔG)·v_new: 2C²d.
// = 6Cd² + 10C²d + 2C³/3 (≈ 11.7 MFLOP at C = 64, d = 128; 48 GFLOP at 8192 tokens × 32 heads, linear in the
// tokens: 192 GFLOP at 32768, 384 at 65536). The backward is counted as twice the forward, the usual convention for
// matrix-bound layers, so fwd+bwd = 3 × fwd.
double forward_flops(int64_t chunks, int64_t Hv) {
  double const C = kChunk, d = kD;
  return static_cast<double>(chunks * Hv) * (6 * C * d * d + 10 * C * C * d + 2 * C * C * C / 3);
}

std::string shape_name(GatedDeltaShape const& s) {  // "8x1024 Hk=16 Hv=32 K=V=128", "pack of 9 (2840 …) Hk=16 …"
  std::string const examples = s.lengths.empty() ? std::to_string(s.examples) + "x" + std::to_string(s.T / s.examples)
                                                 : "pack of " + std::to_string(s.lengths.size()) + " (" +
                                                       std::to_string(s.lengths[0]) + " ...)";
  return examples + " Hk=" + std::to_string(s.Hk) + " Hv=" + std::to_string(s.Hv) + " K=V=128";
}

// "2840,415,1210" → {2840, 415, 1210}: positive lengths, refused with the text otherwise.
std::vector<int> parse_lengths(std::string const& text) {
  std::vector<int> lengths;
  std::size_t at = 0;
  while (at <= text.size()) {
    std::size_t const comma = std::min(text.find(',', at), text.size());
    std::string const item = text.substr(at, comma - at);
    std::size_t used = 0;
    int len = 0;
    try {
      len = std::stoi(item, &used);
    } catch (std::exception const&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || len < 1) {
      throw std::invalid_argument("FUSEPACK_BENCH_GATED_DELTA_LENGTHS='" + text +
                                  "': expected positive example lengths separated by commas; got '" + item + "'");
    }
    lengths.push_back(len);
    at = comma + 1;
  }
  return lengths;
}

// One forward of `shape` under `pass` ("fwd": inference, nothing saved; "fwd save": the training forward) traced
// block by block (gated_delta_trace.h) into `csv` rows: shape, pass, event, ns from the pass's first event, SM, block,
// step. Only the WY kernel and the lean chain's kernels record: a shape the full chain runs has WY rows only.
template <typename Forward>
void trace_forward(std::FILE* csv, std::string const& shape, char const* pass, Forward&& forward) {
  gated_delta_trace_begin();
  forward();
  std::vector<GatedDeltaTraceEvent> const events = gated_delta_trace_end();
  std::uint64_t t0 = events.empty() ? 0 : events.front().ns;
  for (GatedDeltaTraceEvent const& e : events) t0 = std::min(t0, e.ns);
  for (GatedDeltaTraceEvent const& e : events) {
    std::fprintf(csv, "%s,%s,%s,%llu,%d,%d,%d\n", shape.c_str(), pass, gated_delta_trace_kind_name(e.kind),
                 static_cast<unsigned long long>(e.ns - t0), e.sm, e.block, e.step);
  }
  std::printf("gated_delta %s: traced one forward (%s), %zu events\n", shape.c_str(), pass, events.size());
}

void bench_shape(Report& report, GatedDeltaShape const& s, std::FILE* trace_csv) {
  auto const opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  int64_t const T = s.T;
  at::Tensor q = at::randn({T, s.Hk, kD}, opts).requires_grad_(), k = at::randn({T, s.Hk, kD}, opts).requires_grad_(),
             v = at::randn({T, s.Hv, kD}, opts).requires_grad_();
  // As the model feeds it: g = −exp(A_log)·softplus(·) <= 0 in fp32, β = sigmoid(b) in (0, 1).
  at::Tensor g = (-0.1 * at::rand({T, s.Hv}, opts.dtype(at::kFloat))).detach().requires_grad_();
  at::Tensor beta = at::sigmoid(at::randn({T, s.Hv}, opts)).detach().requires_grad_();
  at::Tensor const dout = at::randn({T, s.Hv, kD}, opts);
  std::vector<int32_t> cu_host{0};
  int64_t chunks = 0;
  for (int const len : s.example_lengths()) {
    cu_host.push_back(cu_host.back() + len);
    chunks += (len + kChunk - 1) / kChunk;
  }
  if (cu_host.back() != T) throw std::logic_error("bench gated_delta: the lengths of " + shape_name(s) + " miss T");
  at::Tensor const cu = at::tensor(cu_host, opts.dtype(at::kInt));
  double const scale = 1.0 / std::sqrt(static_cast<double>(kD));
  // The fused backend under `schedule`; the composite takes only the default.
  auto fwd = [&](ops::Backend b, GatedDeltaSchedule schedule = GatedDeltaSchedule::kByShape) {
    return ops::gated_delta(q, k, v, g, beta, cu, scale, true, b, {}, false, schedule).o;
  };
  auto fwd_bwd = [&](ops::Backend b, GatedDeltaSchedule schedule = GatedDeltaSchedule::kByShape) {
    return torch::autograd::grad({fwd(b, schedule)}, {q, k, v, g, beta}, {dout});
  };

  // bf16 fused vs the composite computing in fp32: both round o (and dq, dk, dv, dβ) once to bf16, so they agree to a
  // few 1e-3 in relative RMS; a wrong kernel errs by O(1). Each forced schedule is checked too before it is timed.
  {
    at::Tensor const o_composite = fwd(ops::Backend::kComposite);
    expect_close("gated_delta", "o", fwd(ops::Backend::kFused), o_composite, 1e-2);
    for (GatedDeltaSchedule const schedule : kForcedSchedules) {
      expect_close("gated_delta", std::string("o (") + gated_delta_schedule_name(schedule) + ")",
                   fwd(ops::Backend::kFused, schedule), o_composite, 1e-2);
    }
  }
  {
    auto const gf = fwd_bwd(ops::Backend::kFused), gc = fwd_bwd(ops::Backend::kComposite);
    char const* names[] = {"dq", "dk", "dv", "dg", "dbeta"};
    for (int i = 0; i < 5; ++i) expect_close("gated_delta", names[i], gf[i], gc[i], 1e-2);
  }

  // Fewest bytes: the forward reads q, k, v, g, β and writes o; the backward reads them again with dout and writes
  // dq, dk, dv, dg, dβ. The fused forward's saved tensors for the backward (per-chunk states h and v_new in fp32,
  // Ainv as bf16 parts) and the backward's workspace are not counted.
  double const in_bytes = T * (2.0 * s.Hk * kD * 2 + s.Hv * kD * 2 + s.Hv * 4 + s.Hv * 2);
  double const o_bytes = T * s.Hv * kD * 2.0;
  std::string const shape = shape_name(s);
  // The composite walks an example's chunks one by one (a few ATen ops each): 128 at 1x8192, 1024 at 1x65536, so
  // fewer repetitions for it on one example and fewest on the long ones.
  int const composite_reps = T >= 32768 ? 2 : s.examples == 1 || !s.lengths.empty() ? 5 : 10;
  double fwd_fused = 0, fwd_bwd_fused = 0;
  {
    c10::InferenceMode inference;
    double const composite = time_cuda([&] { fwd(ops::Backend::kComposite); }, composite_reps, 1).ms;
    fwd_fused = time_cuda([&] { fwd(ops::Backend::kFused); }).ms;
    report.add({"gated_delta", shape, "fwd", composite, fwd_fused, in_bytes + o_bytes});
  }
  double const composite = time_cuda([&] { fwd_bwd(ops::Backend::kComposite); }, composite_reps, 1).ms;
  fwd_bwd_fused = time_cuda([&] { fwd_bwd(ops::Backend::kFused); }).ms;
  report.add({"gated_delta", shape, "fwd+bwd", composite, fwd_bwd_fused, 3 * in_bytes + 2 * o_bytes});
  double const flops = forward_flops(chunks, s.Hv);
  std::printf("gated_delta %s: %.1f GFLOP fwd; fused fwd %.0f TFLOP/s, fwd+bwd %.0f TFLOP/s\n", shape.c_str(),
              flops / 1e9, flops / (fwd_fused * 1e-3) / 1e12, 3 * flops / (fwd_bwd_fused * 1e-3) / 1e12);

  // The fused kernels under each forced schedule (the report's fused times are the launcher's pick by shape), to show
  // where the by-shape threshold sits against the crossover of the two. Each inside an NVTX range named
  // "<shape> <schedule>" (for example "1x8192 Hk=16 Hv=32 K=V=128 lean chain"), so that a profiler can pick out one
  // shape's kernels: ncu --nvtx --nvtx-include "1x8192 Hk=16 Hv=32 K=V=128 lean chain/" -k regex:gated_delta.
  std::string line = "gated_delta " + shape + " schedules:";
  char const* sep = " ";
  for (GatedDeltaSchedule const schedule : kForcedSchedules) {
    nvtxRangePushA((shape + " " + gated_delta_schedule_name(schedule)).c_str());
    double forced_fwd = 0;
    {
      c10::InferenceMode inference;
      forced_fwd = time_cuda([&] { fwd(ops::Backend::kFused, schedule); }).ms;
    }
    double const forced_fwd_bwd = time_cuda([&] { fwd_bwd(ops::Backend::kFused, schedule); }).ms;
    nvtxRangePop();
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s%s fwd %.3f / fwd+bwd %.3f ms", sep, gated_delta_schedule_name(schedule),
                  forced_fwd, forced_fwd_bwd);
    line += buf;
    sep = "; ";
  }
  std::printf("%s\n", line.c_str());

  if (trace_csv != nullptr) {
    {
      c10::InferenceMode inference;
      trace_forward(trace_csv, shape, "fwd", [&] { fwd(ops::Backend::kFused); });
    }
    trace_forward(trace_csv, shape, "fwd save", [&] { fwd(ops::Backend::kFused); });
  }
}

}  // namespace

// Qwen3.5 Gated DeltaNet, bf16, K = V = 128, q/k l2-normalised in the op, no initial/final state (the training path):
// at 8192 tokens, 9B/35B heads (16 key, 32 value) and 27B heads (16, 48), packed as 8 × 1024 and as one example; and
// one long example of 32768 and of 65536 tokens at the 9B/35B heads, where the state chain is the whole time; and a
// training pack of mixed lengths at Qwen3.5-0.8B's heads (kTrainingPack).
// FUSEPACK_BENCH_GATED_DELTA_SHAPE=<text> runs only the shapes whose name ("1x8192 Hk=16 Hv=32 K=V=128") contains
// it, for profiling one shape without the others' minutes of composite timing.
// FUSEPACK_BENCH_GATED_DELTA_LENGTHS=<n,n,...> runs only one pack of those example lengths at Qwen3.5-0.8B's heads
// (as kTrainingPack), to time the schedules on packs a training run makes.
// FUSEPACK_BENCH_GATED_DELTA_TRACE=<file.csv> also writes, per shape, the block timeline of one forward without and
// one with saved tensors (gated_delta_trace.h; ci/gated_delta_trace.py summarizes it), in a build configured with
// -DFUSEPACK_GATED_DELTA_TRACE=ON; other builds refuse it before timing anything.
void bench_gated_delta(Report& report) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> trace_csv(nullptr, &std::fclose);
  if (char const* const path = std::getenv("FUSEPACK_BENCH_GATED_DELTA_TRACE")) {
    if (!gated_delta_trace_built()) {
      throw std::invalid_argument(std::string("FUSEPACK_BENCH_GATED_DELTA_TRACE='") + path +
                                  "': this build does not record the forward's timeline; configure with "
                                  "-DFUSEPACK_GATED_DELTA_TRACE=ON");
    }
    trace_csv.reset(std::fopen(path, "w"));
    if (!trace_csv) {
      throw std::invalid_argument(std::string("FUSEPACK_BENCH_GATED_DELTA_TRACE='") + path +
                                  "': cannot open it for writing");
    }
    std::fprintf(trace_csv.get(), "shape,pass,event,ns,sm,block,step\n");
  }
  if (char const* const lengths = std::getenv("FUSEPACK_BENCH_GATED_DELTA_LENGTHS")) {
    GatedDeltaShape pack{kTrainingPack.Hk, kTrainingPack.Hv, 0, 0, parse_lengths(lengths)};
    pack.examples = static_cast<int64_t>(pack.lengths.size());
    for (int const len : pack.lengths) pack.T += len;
    bench_shape(report, pack, trace_csv.get());
    return;
  }
  char const* const only = std::getenv("FUSEPACK_BENCH_GATED_DELTA_SHAPE");
  std::string names;
  int ran = 0;
  for (GatedDeltaShape const& s : {GatedDeltaShape{16, 32, 8, 8192}, GatedDeltaShape{16, 32, 1, 8192},
                                  GatedDeltaShape{16, 48, 8, 8192}, GatedDeltaShape{16, 48, 1, 8192},
                                  GatedDeltaShape{16, 32, 1, 32768}, GatedDeltaShape{16, 32, 1, 65536},
                                  kTrainingPack}) {
    names += (names.empty() ? "" : ", ") + shape_name(s);
    if (only != nullptr && shape_name(s).find(only) == std::string::npos) continue;
    bench_shape(report, s, trace_csv.get());
    ++ran;
  }
  if (ran == 0) {
    throw std::invalid_argument(std::string("FUSEPACK_BENCH_GATED_DELTA_SHAPE='") + only +
                                "' is in no shape's name; the shapes are " + names);
  }
  std::printf(
      "gated_delta anchors (Hk=16 Hv=32 K=V=128 bf16): HF torch fallback 6.70 ms fwd / "
      "30.3 ms fwd+bwd at 8x1024 (padded batch, no packing support); published H200 numbers, FLA 0.5.1: fwd 0.47 ms "
      "(1x8192) / 0.50 ms (8x1024), bwd 1.44 / 1.50 ms; FlashQLA: fwd 0.28 / 0.18 ms, bwd 0.79 / 0.76 ms\n");
}

}  // namespace fusepack::bench
