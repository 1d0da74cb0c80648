// init_parameter_rows (trainer/model/init.h), the initialisation a sharded trainer runs per rank: any split of a
// parameter's rows reassembles the whole bit for bit; values do not depend on other parameters; names and seeds give
// uncorrelated values; the normal and log-uniform laws hold within bounds set by the sample size; each dtype holds
// the fp64 value rounded to nearest; bad arguments are refused by name; and (suite *Cuda*) a CUDA device computes
// the same bits as the CPU.
#include "trainer/model/init.h"
#include "trainer/model/init_element.h"

#include "trainer/model/config.h"
#include "trainer/model/parameters.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/torch_bridge.h"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using model::init_parameter_rows;
using model::ParameterInit;
using model::ParameterSpec;
namespace init_math = model::init_math;

constexpr double kRange = 0.02;  // Qwen3.5's initializer_range

std::vector<ParameterSpec> tiny_specs() { return model::parameter_specs(model::preset("qwen35-tiny")); }

ParameterSpec tiny_spec(std::string const& name) {
  for (ParameterSpec const& s : tiny_specs()) {
    if (s.name == name) return s;
  }
  throw std::invalid_argument("qwen35-tiny has no parameter " + name);
}

// Rows [begin, begin + count) of `spec`, generated on their own.
at::Tensor rows(ParameterSpec const& spec, std::uint64_t seed, std::int64_t begin, std::int64_t count,
                at::ScalarType dtype, at::Device device = at::kCPU) {
  std::vector<std::int64_t> shape = spec.shape;
  shape[0] = count;
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype).device(device));
  init_parameter_rows(spec, kRange, seed, begin, out);
  return out;
}

at::Tensor whole(ParameterSpec const& spec, std::uint64_t seed, at::ScalarType dtype, at::Device device = at::kCPU) {
  return rows(spec, seed, 0, spec.shape[0], dtype, device);
}

// FSDP's split of `spec`'s rows over `ranks`: chunks of ceil(rows / ranks), the last ones short or empty, each
// generated separately and concatenated.
at::Tensor sharded(ParameterSpec const& spec, std::uint64_t seed, int ranks, at::ScalarType dtype,
                   at::Device device = at::kCPU) {
  std::int64_t const n = spec.shape[0], chunk = (n + ranks - 1) / ranks;
  std::vector<at::Tensor> parts;
  for (int r = 0; r < ranks; ++r) {
    std::int64_t const begin = std::min(r * chunk, n), end = std::min(begin + chunk, n);
    parts.push_back(rows(spec, seed, begin, end - begin, dtype, device));
  }
  return at::cat(parts, 0);
}

// The tensor's bytes as integers of the same width: equality of these is equality bit for bit (0 ≠ −0).
at::Tensor bits(at::Tensor const& t) {
  switch (t.element_size()) {
    case 8: return t.contiguous().view(at::kLong).cpu();
    case 4: return t.contiguous().view(at::kInt).cpu();
    default: return t.contiguous().view(at::kShort).cpu();
  }
}

// Where two tensors of the same shape differ in their bits, for a failure message.
std::string first_difference(at::Tensor const& a, at::Tensor const& b) {
  if (a.sizes() != b.sizes()) return "shapes differ";
  at::Tensor const diff = at::ne(bits(a), bits(b)).flatten().nonzero();
  if (diff.numel() == 0) return "none";
  std::int64_t const i = diff[0].item<std::int64_t>();
  at::Tensor const fa = a.flatten().cpu().to(at::kDouble), fb = b.flatten().cpu().to(at::kDouble);
  return std::to_string(diff.numel()) + " elements, first at flat index " + std::to_string(i) + ": " +
         std::to_string(fa[i].item<double>()) + " vs " + std::to_string(fb[i].item<double>());
}

void expect_same_bits(at::Tensor const& got, at::Tensor const& want, std::string const& what) {
  EXPECT_TRUE(got.sizes() == want.sizes() && at::equal(bits(got), bits(want)))
      << what << ": differs from the whole parameter generated at once; " << first_difference(got, want);
}

std::vector<double> to_vector(at::Tensor const& t) {
  at::Tensor const c = t.to(at::kDouble).flatten().contiguous().cpu();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

double mean_of(std::vector<double> const& x) {
  double s = 0;
  for (double v : x) s += v;
  return s / static_cast<double>(x.size());
}

double correlation(std::vector<double> const& x, std::vector<double> const& y) {
  double const mx = mean_of(x), my = mean_of(y);
  double sxy = 0, sxx = 0, syy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxy / std::sqrt(sxx * syy);
}

// Kolmogorov–Smirnov distance sup |F_n − F| of a sample from the continuous CDF `cdf`.
template <typename Cdf>
double ks_distance(std::vector<double> x, Cdf cdf) {
  std::sort(x.begin(), x.end());
  double const n = static_cast<double>(x.size());
  double d = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    double const f = cdf(x[i]);
    d = std::max({d, static_cast<double>(i + 1) / n - f, f - static_cast<double>(i) / n});
  }
  return d;
}

// Dvoretzky–Kiefer–Wolfowitz: P(sup |F_n − F| > ε) ≤ 2·exp(−2nε²), so a correct generator passes this bound for all
// but a 1e-9 share of seeds, while a distortion of the law by more than ~3/√n shows.
double dkw_bound(std::size_t n) { return std::sqrt(std::log(2.0 / 1e-9) / (2.0 * static_cast<double>(n))); }

// 6 standard errors: a correct generator exceeds it for about 2e-9 of seeds.
constexpr double kSigmas = 6.0;

// ------------------------------------------------------------------------------------------------------------------
// The generator

// Random123's kat_vectors for philox4x32 with 10 rounds: counter (4 words), key (2 words) → output (4 words).
TEST(Philox4x32, MatchesRandom123KnownAnswers) {
  struct Case {
    init_math::Philox4x32 ctr;
    std::uint32_t k0, k1;
    init_math::Philox4x32 want;
  };
  Case const known_answers[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (Case const& c : known_answers) {
    init_math::Philox4x32 const got = init_math::philox4x32_10(c.ctr, c.k0, c.k1);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(got.v[w], c.want.v[w]) << "word " << w << " for key " << c.k0;
  }
}

double ulp_of(double x) {
  x = std::fabs(x);
  return std::nextafter(x, std::numeric_limits<double>::infinity()) - x;
}

// log and cos are built from correctly rounded operations (so CPU and CUDA agree); here they meet the x86 long double
// libm (64-bit significand, 2^11 times finer than a double) on the arguments init_element gives them. Measured over
// 2M arguments and 8 seeds: log ≤ 2.8 ulp (s = (f−1)/(f+1) is rounded twice, then the sums), cos ≤ 0.73 ulp of 1.
// The bounds, 4 ulp and 2 ulp of 1, leave room for that; a wrong coefficient or reduction errs by thousands of ulp.
TEST(InitMath, LogAndCosAreWithinAFewUlpOfLongDoubleLibm) {
  std::mt19937_64 rng = test_rng();
  int const n = cases(200000, 2000000);
  double worst_log_ulp = 0, worst_cos_abs = 0;
  for (int i = 0; i < n; ++i) {
    std::uint64_t const w = rng();
    // the two log arguments init_element uses: u1 = (2m+1)/2^53 and v in [0.01, 16)
    double const u1 = static_cast<double>(((w >> 12) << 1) | 1u) * 0x1p-53;
    double const v = std::fma(15.99, static_cast<double>(w >> 11) * 0x1p-53, 0.01);
    for (double x : {u1, v}) {
      double const got = init_math::log_atanh_series(x);
      long double const want = std::log(static_cast<long double>(x));
      worst_log_ulp = std::max(worst_log_ulp, static_cast<double>(std::fabs(got - want)) / ulp_of(got));
    }
    std::uint64_t const m = ((w >> 12) << 1) | 1u;
    long double const turns = static_cast<long double>(m) * 0x1p-53L;
    long double const want = std::cos(2 * 3.14159265358979323846264338327950288L * turns);
    worst_cos_abs = std::max(worst_cos_abs, static_cast<double>(std::fabs(init_math::cos_turns53(m) - want)));
  }
  std::printf("[  check   ] log: worst %.2f ulp, cos: worst %.3g abs (= %.2f ulp of 1) over %d arguments\n",
              worst_log_ulp, worst_cos_abs, worst_cos_abs / ulp_of(1.0), n);
  EXPECT_LE(worst_log_ulp, 4.0);
  EXPECT_LE(worst_cos_abs, 2 * ulp_of(1.0));
  // The quarter-turn points are exact.
  EXPECT_EQ(init_math::cos_turns53(0), 1.0);
  EXPECT_EQ(init_math::cos_turns53(std::uint64_t{1} << 52), -1.0);
  EXPECT_EQ(init_math::log_atanh_series(1.0), 0.0);
}

// The first elements of two parameters for the default seed, as this implementation made them when it was written.
// Every model initialised with fusepack depends on these: a change must be deliberate, and bump this list.
TEST(InitParameterRows, ValuesArePinned) {
  at::Tensor const embed = rows(tiny_spec("model.embed_tokens.weight"), kDefaultSeed, 0, 1, at::kDouble);
  at::Tensor const a_log = whole(tiny_spec("model.layers.0.linear_attn.A_log"), kDefaultSeed, at::kDouble);
  // 0.0071586442596202069, -0.021835688554961076, 0.010878229756266072, 0.00046468309946347367
  std::uint64_t const want_embed[4] = {0x3f7d5261efa90781ull, 0xbf965c1840eab33aull, 0x3f86475348551143ull,
                                       0x3f3e7416b7175113ull};
  // 1.1926481536787734, 2.5274882096142828, -0.86692901860595517, 2.5018112241238706
  std::uint64_t const want_a_log[4] = {0x3ff315163afaf63aull, 0x4004384bbd0a8d2full, 0xbfebbde1ecdbb5e3ull,
                                       0x400403b59a6305a2ull};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(init_math::bits_of(embed[0][i].item<double>()), want_embed[i])
        << "model.embed_tokens.weight[0][" << i << "] = " << embed[0][i].item<double>();
    EXPECT_EQ(init_math::bits_of(a_log[i].item<double>()), want_a_log[i])
        << "A_log[" << i << "] = " << a_log[i].item<double>();
  }
}

// ------------------------------------------------------------------------------------------------------------------
// Sharding and independence

// Parameters of every rank and rule: 2-D, 3-D (conv1d), 1-D (A_log, dt_bias, a norm), fewer rows than ranks
// (A_log, in_proj_b: 4 rows), and an odd-length 1-D normal vector that no model has.
std::vector<ParameterSpec> shard_specs() {
  std::vector<ParameterSpec> specs;
  for (char const* name : {"model.embed_tokens.weight", "model.layers.0.linear_attn.conv1d.weight",
                           "model.layers.0.linear_attn.in_proj_b.weight", "model.layers.0.linear_attn.A_log",
                           "model.layers.0.linear_attn.dt_bias", "model.layers.3.self_attn.q_proj.weight",
                           "model.layers.3.self_attn.q_norm.weight", "lm_head.weight"}) {
    specs.push_back(tiny_spec(name));
  }
  specs.push_back({"test.odd_vector", {1001}, ParameterInit::kNormal});
  return specs;
}

TEST(InitParameterRows, AnySplitOfTheRowsConcatenatesToTheWholeParameter) {
  std::uint64_t const seed = test_seed();
  for (ParameterSpec const& spec : shard_specs()) {
    for (at::ScalarType dtype : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf}) {
      at::Tensor const all = whole(spec, seed, dtype);
      for (int ranks = 1; ranks <= 5; ++ranks) {
        expect_same_bits(sharded(spec, seed, ranks, dtype), all,
                         spec.name + " " + c10::toString(dtype) + " over " + std::to_string(ranks) + " ranks");
      }
    }
  }
  // Arbitrary row ranges too, not only FSDP's.
  ParameterSpec const conv = tiny_spec("model.layers.0.linear_attn.conv1d.weight");
  at::Tensor const all = whole(conv, seed, at::kFloat);
  std::mt19937_64 rng = test_rng();
  for (int i = 0; i < cases(50, 500); ++i) {
    std::int64_t a = static_cast<std::int64_t>(rng() % (conv.shape[0] + 1));
    std::int64_t b = static_cast<std::int64_t>(rng() % (conv.shape[0] + 1));
    if (a > b) std::swap(a, b);
    expect_same_bits(rows(conv, seed, a, b - a, at::kFloat), all.slice(0, a, b),
                     conv.name + " rows [" + std::to_string(a) + ", " + std::to_string(b) + ")");
  }
}

TEST(InitParameterRows, DoesNotDependOnOtherParametersOrTheirOrder) {
  std::uint64_t const seed = test_seed();
  std::vector<ParameterSpec> specs = tiny_specs();
  std::vector<at::Tensor> in_order;
  for (ParameterSpec const& s : specs) in_order.push_back(whole(s, seed, at::kFloat));
  std::vector<std::size_t> reversed(specs.size());
  for (std::size_t i = 0; i < reversed.size(); ++i) reversed[i] = reversed.size() - 1 - i;
  std::vector<std::size_t> shuffled = reversed;
  std::shuffle(shuffled.begin(), shuffled.end(), test_rng());
  for (auto const& o : {reversed, shuffled}) {
    std::vector<at::Tensor> got(specs.size());
    for (std::size_t i : o) got[i] = whole(specs[i], seed, at::kFloat);
    for (std::size_t i = 0; i < specs.size(); ++i) expect_same_bits(got[i], in_order[i], specs[i].name);
  }
  // Alone, in a row range of its own, and after a parameter of a different shape and rule.
  for (std::size_t i = 0; i < specs.size(); i += 7) {
    expect_same_bits(rows(specs[i], seed, 0, specs[i].shape[0], at::kFloat), in_order[i], specs[i].name + " alone");
  }
}

// For independent normal samples of size n the sample correlation has standard deviation 1/√n; 6/√n (0.006 at 1M)
// passes for all but ~2e-9 of seeds while any shared stream (equal keys, overlapping counters) gives |r| near 1.
TEST(InitParameterRows, DifferentNamesSeedsAndElementsAreUncorrelated) {
  std::uint64_t const seed = test_seed();
  ParameterSpec const a{"model.layers.0.mlp.up_proj.weight", {1024, 1024}, ParameterInit::kNormal};
  ParameterSpec b = a;
  b.name = "model.layers.1.mlp.up_proj.weight";  // one byte apart
  std::vector<double> const x = to_vector(whole(a, seed, at::kDouble));
  std::vector<double> const y = to_vector(whole(b, seed, at::kDouble));
  std::vector<double> const x_next_seed = to_vector(whole(a, seed + 1, at::kDouble));
  std::vector<double> const x_shift(x.begin() + 1, x.end()), x_trim(x.begin(), x.end() - 1);
  double const bound = kSigmas / std::sqrt(static_cast<double>(x.size()));
  double const r_name = correlation(x, y), r_seed = correlation(x, x_next_seed), r_lag = correlation(x_trim, x_shift);
  std::printf("[  check   ] correlation: names %.2e, seeds %.2e, neighbouring elements %.2e (bound %.2e)\n", r_name,
              r_seed, r_lag, bound);
  EXPECT_LT(std::fabs(r_name), bound) << a.name << " vs " << b.name;
  EXPECT_LT(std::fabs(r_seed), bound) << "seed " << seed << " vs " << seed + 1;
  EXPECT_LT(std::fabs(r_lag), bound) << "element j vs j + 1";
}

// ------------------------------------------------------------------------------------------------------------------
// The laws of the rules

TEST(InitParameterRows, NormalHasTheConfiguredMeanStdTailsAndShape) {
  ParameterSpec const spec{"model.layers.0.mlp.gate_proj.weight", {1024, 1024}, ParameterInit::kNormal};
  std::vector<double> const x = to_vector(whole(spec, test_seed(), at::kDouble));
  double const n = static_cast<double>(x.size()), sigma = kRange;
  double const mean = mean_of(x);
  double ss = 0, beyond_3 = 0, max_abs = 0;
  for (double v : x) {
    ss += (v - mean) * (v - mean);
    beyond_3 += std::fabs(v) > 3 * sigma;
    max_abs = std::max(max_abs, std::fabs(v));
  }
  double const std_dev = std::sqrt(ss / (n - 1));
  double const p3 = std::erfc(3 / std::sqrt(2.0));  // P(|Z| > 3) = 0.26998%
  double const ks = ks_distance(x, [&](double v) { return 0.5 * std::erfc(-v / (sigma * std::sqrt(2.0))); });
  std::printf("[  check   ] normal: mean %.3g, std %.6g, beyond 3σ %.5f%% (expected %.5f%%), KS %.3g (bound %.3g)\n",
              mean, std_dev, 100 * beyond_3 / n, 100 * p3, ks, dkw_bound(x.size()));
  EXPECT_LT(std::fabs(mean), kSigmas * sigma / std::sqrt(n));
  EXPECT_LT(std::fabs(std_dev - sigma), kSigmas * sigma / std::sqrt(2 * n));  // SE of a normal sample's std
  EXPECT_LT(std::fabs(beyond_3 / n - p3), kSigmas * std::sqrt(p3 * (1 - p3) / n));
  EXPECT_LT(ks, dkw_bound(x.size()));
  // u1 ≥ 2^-53 caps the Box–Muller radius at √(106 ln 2) = 8.57σ, by construction.
  EXPECT_LE(max_abs, std::sqrt(-2 * std::log(0x1p-53)) * sigma);
}

// A_log = ln v, v ~ U(0.01, 16): E[ln v] = (b ln b − a ln a)/(b − a) − 1 = 1.7772027052968343 and
// sd = 0.98282137571318798 (from E[ln² v] = [x ln² x − 2x ln x + 2x]_a^b / (b − a)), P(ln v < 0) = 0.99/15.99.
TEST(InitParameterRows, ALogIsTheLogOfAUniformOn0p01To16) {
  ParameterSpec const spec{"model.layers.0.linear_attn.A_log", {1 << 20}, ParameterInit::kALog};
  std::vector<double> const x = to_vector(whole(spec, test_seed(), at::kDouble));
  double const n = static_cast<double>(x.size());
  double const want_mean = 1.7772027052968343, want_sd = 0.98282137571318798, want_neg = 0.99 / 15.99;
  double const lo = *std::min_element(x.begin(), x.end()), hi = *std::max_element(x.begin(), x.end());
  double negative = 0;
  for (double v : x) negative += v < 0;
  double const mean = mean_of(x);
  double const ks = ks_distance(x, [](double v) { return (std::exp(v) - 0.01) / 15.99; });
  std::printf("[  check   ] A_log: range [%.17g, %.17g], mean %.6f (expected %.6f), below 0 %.5f (expected %.5f), "
              "KS %.3g (bound %.3g)\n",
              lo, hi, mean, want_mean, negative / n, want_neg, ks, dkw_bound(x.size()));
  // The bounds of ln on [0.01, 16), widened by the 4 ulp that log_atanh_series may differ from the true logarithm.
  EXPECT_GE(lo, std::log(0.01) - 4 * ulp_of(std::log(0.01)));
  EXPECT_LE(hi, std::log(16.0) + 4 * ulp_of(std::log(16.0)));
  EXPECT_LT(std::fabs(mean - want_mean), kSigmas * want_sd / std::sqrt(n));
  EXPECT_LT(std::fabs(negative / n - want_neg), kSigmas * std::sqrt(want_neg * (1 - want_neg) / n));
  EXPECT_LT(ks, dkw_bound(x.size()));
}

TEST(InitParameterRows, ZerosAndOnesAreExactInEveryDtype) {
  for (char const* name : {"model.norm.weight", "model.layers.0.linear_attn.dt_bias"}) {
    ParameterSpec const spec = tiny_spec(name);
    double const want = spec.init == ParameterInit::kOnes ? 1.0 : 0.0;
    for (at::ScalarType dtype : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf}) {
      at::Tensor const t = whole(spec, test_seed(), dtype);
      expect_same_bits(t, at::full_like(t, want), spec.name + " " + c10::toString(dtype));
    }
  }
}

// The nearest of `got` and its two neighbours in its dtype to `want`, ties to an even last bit: decides "rounded to
// nearest" without another implementation of rounding to compare against.
void expect_nearest(at::ScalarType dtype, double want, std::int64_t got_bits, std::string const& what) {
  auto value = [&](std::int64_t b) -> double {
    auto const b16 = static_cast<std::uint16_t>(b);
    switch (dtype) {
      case at::kFloat: return init_math::bit_cast<float>(static_cast<std::uint32_t>(b));
      case at::kBFloat16: return static_cast<float>(c10::BFloat16(b16, c10::BFloat16::from_bits()));
      default: return static_cast<float>(c10::Half(b16, c10::Half::from_bits()));
    }
  };
  double const got = value(got_bits), err = std::fabs(got - want);
  for (std::int64_t nb : {got_bits - 1, got_bits + 1}) {
    double const other = value(nb);
    if (std::isnan(other)) continue;
    double const other_err = std::fabs(other - want);
    ASSERT_TRUE(err < other_err || (err == other_err && (got_bits & 1) == 0))
        << what << ": " << want << " became " << got << " but " << other << " is nearer (or an even tie)";
  }
}

TEST(InitParameterRows, EachDtypeHoldsTheFp64ValueRoundedToNearest) {
  std::uint64_t const seed = test_seed();
  ParameterSpec const a_log{"model.layers.0.linear_attn.A_log", {1 << 14}, ParameterInit::kALog};
  for (ParameterSpec const& spec : {tiny_spec("model.embed_tokens.weight"), a_log}) {
    std::vector<double> const want = to_vector(whole(spec, seed, at::kDouble));
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      at::Tensor const got = bits(whole(spec, seed, dtype)).to(at::kLong).flatten();
      std::int64_t const* g = got.data_ptr<std::int64_t>();
      for (std::size_t i = 0; i < want.size(); ++i) {
        // the integer view of a 16-bit float is signed; the bit pattern is what the neighbours step through
        std::int64_t const b =
            dtype == at::kFloat ? static_cast<std::uint32_t>(g[i]) : static_cast<std::uint16_t>(g[i]);
        expect_nearest(dtype, want[i], b, spec.name + " " + c10::toString(dtype) + " element " + std::to_string(i));
        if (HasFatalFailure()) return;
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------------------------
// Arguments

TEST(InitParameterRows, RejectsWrongShapesRowRangesDtypesAndDevices) {
  ParameterSpec const embed = tiny_spec("model.embed_tokens.weight");  // [256, 64]
  auto call = [&](at::Tensor out, std::int64_t row_begin, double range = kRange) {
    init_parameter_rows(embed, range, 1, row_begin, out);
  };
  auto f32 = at::TensorOptions().dtype(at::kFloat);
  std::string const who = "init_parameter_rows(model.embed_tokens.weight): ";
  FUSEPACK_EXPECT_INVALID_ARGUMENT(call(at::empty({256}, f32), 0), who + "out has shape [256]");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(call(at::empty({8, 63}, f32), 0), "must have shape [8, 64]");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(call(at::empty({8, 64}, f32), -1), who + "row_begin is -1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(call(at::empty({0, 64}, f32), 257), who + "row_begin is 257");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(call(at::empty({10, 64}, f32), 250), who + "rows [250, 260) run past");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(call(at::empty({8, 64}, f32.dtype(at::kInt)), 0),
                                   who + "out is Int; expected fp64, fp32, bf16 or fp16");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(call(at::empty({64, 8}, f32).t(), 0), who + "out must be contiguous");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(call(at::empty({8, 64}, f32.device(at::kMeta)), 0),
                                   who + "out is on meta; expected the CPU or a CUDA device");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(call(at::Tensor(), 0), who + "out is an undefined tensor");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(call(at::empty({8, 64}, f32), 0, 0.0), who + "initializer_range must be finite");
  double const nan = std::numeric_limits<double>::quiet_NaN();
  FUSEPACK_EXPECT_INVALID_ARGUMENT(call(at::empty({8, 64}, f32), 0, nan), who + "initializer_range must be finite");
  // An empty slice at the end is what the last ranks of an uneven split hold.
  EXPECT_NO_THROW(call(at::empty({0, 64}, f32), 256));
}

// ------------------------------------------------------------------------------------------------------------------
// CUDA (labels trainer + gpu)

// Bit for bit, also in fp64: init_element uses only integer math and correctly rounded +, −, ×, ÷, sqrt and fma,
// which CUDA and the host compute identically, and its own log and cos instead of two libms that differ in the last
// bit; the dtype rounding is the same integer code on both sides.
TEST(InitParameterRowsCuda, EqualsTheCpuBitForBitInEveryDtypeAndSplit) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  std::uint64_t const seed = test_seed();
  at::Device const cuda(at::kCUDA, 0);
  for (ParameterSpec const& spec : shard_specs()) {
    for (at::ScalarType dtype : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf}) {
      at::Tensor const cpu = whole(spec, seed, dtype);
      for (int ranks = 1; ranks <= 5; ++ranks) {
        expect_same_bits(sharded(spec, seed, ranks, dtype, cuda), cpu,
                         spec.name + " " + c10::toString(dtype) + " on CUDA over " + std::to_string(ranks) + " ranks");
      }
    }
  }
  // 4M elements of each random rule: were the two sides' doubles to differ in a last bit now and then, a few of these
  // would land next to an fp32 or bf16 rounding midpoint and show.
  ParameterSpec const gate{"model.layers.0.mlp.gate_proj.weight", {2048, 2048}, ParameterInit::kNormal};
  ParameterSpec const a_log{"model.layers.0.linear_attn.A_log", {1 << 22}, ParameterInit::kALog};
  for (ParameterSpec const& spec : {gate, a_log}) {
    for (at::ScalarType dtype : {at::kDouble, at::kFloat, at::kBFloat16}) {
      expect_same_bits(whole(spec, seed, dtype, cuda), whole(spec, seed, dtype),
                       spec.name + " " + c10::toString(dtype) + " on CUDA");
    }
  }
}

}  // namespace
}  // namespace fusepack::test
