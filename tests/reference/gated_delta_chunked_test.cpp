// The chunked gated delta rule that kernels/gated_delta/ computes, forward and backward, emulated in fp64 with the
// kernels' decomposition (the tensors the forward saves, the reverse chunk recurrence, the per-chunk gradients, the
// ordered GQA sum), against the naive per-token recurrence of reference/gated_delta: the kernels' algorithm, proved
// without a GPU. Chunk size is a parameter: small chunks exercise many chunk boundaries on short examples.
#include "reference/gated_delta.h"

#include "tests/support/compare.h"
#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/random.h"

#include <Eigen/Dense>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using ref::Index;
using ref::Tensor;
using Mat = Eigen::MatrixXd;
using Vec = Eigen::VectorXd;

// A chunk: tokens [start, start + len) of one example, never more than the chunk size, never across examples.
struct Chunk {
  Index start, len, example;
};
std::vector<Chunk> chunk_table(std::vector<std::int32_t> const& cu, Index chunk) {
  std::vector<Chunk> chunks;
  for (size_t n = 0; n + 1 < cu.size(); ++n) {
    for (Index s = cu[n]; s < cu[n + 1]; s += chunk)
      chunks.push_back({s, std::min<Index>(chunk, cu[n + 1] - s), Index(n)});
  }
  return chunks;
}

struct Inputs {
  Tensor q, k, v, g, beta, initial_state;  // initial_state may be undefined
  std::vector<std::int32_t> cu_seqlens;
  double scale = 1;
  bool use_qk_l2norm = true;
  Index Hk() const { return q.size(1); }
  Index Hv() const { return v.size(1); }
  Index K() const { return q.size(2); }
  Index V() const { return v.size(2); }
};

// What the forward saves for the backward, laid out as GatedDeltaFwdParams defines it (Ainv: [T, Hv, chunk], the
// values whose bf16 parts the fused forward saves), plus gcum, the forward's in-chunk cumsum of g, which the backward
// does not read: like the fp32 kernels (which sum in fp64 there), it sums g within the chunk itself.
struct Saved {
  Tensor q_rstd, k_rstd, gcum, Ainv, h, v_new;
};

// One chunk of one value head, rebuilt from the inputs and the saved rstd, as every kernel pass rebuilds it.
struct ChunkView {
  Mat q_hat, k_hat;  // [L, K]: q̂ = scale·q·rstd_q, k̂ = k·rstd_k
  Mat v, T;          // [L, V] v; [L, L] (I + A)^-1 from the saved Ainv rows
  Vec G, beta;       // [L] in-chunk cumulative g, β
  Index L;
  // Decay exp(G_i − G_j) on and below the diagonal (i >= j), 0 above.
  double decay(Index i, Index j) const { return i >= j ? std::exp(G(i) - G(j)) : 0.0; }
  double gamma() const { return std::exp(G(L - 1)); }                 // exp(G_last)
  double to_end(Index j) const { return std::exp(G(L - 1) - G(j)); }  // exp(G_last − G_j)
};

ChunkView view(Inputs const& in, Saved const& s, Chunk const& c, Index j, bool with_T) {
  Index const hk = j / (in.Hv() / in.Hk()), L = c.len;
  ChunkView cv;
  cv.L = L;
  cv.q_hat.resize(L, in.K());
  cv.k_hat.resize(L, in.K());
  cv.v.resize(L, in.V());
  cv.G.resize(L);
  cv.beta.resize(L);
  if (with_T) cv.T.resize(L, L);
  for (Index i = 0; i < L; ++i) {
    Index const t = c.start + i;
    cv.q_hat.row(i) = in.scale * s.q_rstd({t, hk}) * in.q.vec({t, hk}).transpose();
    cv.k_hat.row(i) = s.k_rstd({t, hk}) * in.k.vec({t, hk}).transpose();
    cv.v.row(i) = in.v.vec({t, j}).transpose();
    cv.G(i) = (i > 0 ? cv.G(i - 1) : 0.0) + in.g({t, j});
    cv.beta(i) = in.beta({t, j});
    if (with_T) {
      for (Index jj = 0; jj < L; ++jj) cv.T(i, jj) = s.Ainv({t, j, jj});
    }
  }
  return cv;
}

// P[i, j] = (q̂_i·k̂_j) exp(G_i − G_j) for i >= j; Â[i, j] = (k̂_i·k̂_j) exp(G_i − G_j) for i > j (A = diag(β) Â).
Mat intra_p(ChunkView const& cv) {
  Mat P = cv.q_hat * cv.k_hat.transpose();
  for (Index i = 0; i < cv.L; ++i) {
    for (Index jj = 0; jj < cv.L; ++jj) P(i, jj) *= cv.decay(i, jj);
  }
  return P;
}
Mat intra_a_hat(ChunkView const& cv) {
  Mat A = cv.k_hat * cv.k_hat.transpose();
  for (Index i = 0; i < cv.L; ++i) {
    for (Index jj = 0; jj < cv.L; ++jj) A(i, jj) *= i > jj ? cv.decay(i, jj) : 0.0;
  }
  return A;
}

struct ChunkedOut {
  Tensor o, final_state;
  Saved saved;
};

// The forward, chunk by chunk: rstd, gcum, Ainv = (I + A)^-1, h (the state entering each chunk), v_new = u − w·h,
// o = (q̂ ⊙ exp(G)) h + P v_new, h_next = exp(G_last) h + (k̂ ⊙ exp(G_last − G))ᵀ v_new.
ChunkedOut chunked_fwd(Inputs const& in, Index chunk) {
  Index const T = in.q.size(0), Hk = in.Hk(), Hv = in.Hv(), K = in.K(), V = in.V();
  Index const N = Index(in.cu_seqlens.size()) - 1;
  std::vector<Chunk> const chunks = chunk_table(in.cu_seqlens, chunk);
  Index const NC = Index(chunks.size());
  ChunkedOut out;
  Saved& s = out.saved;
  s.q_rstd = Tensor({T, Hk});
  s.k_rstd = Tensor({T, Hk});
  s.gcum = Tensor({T, Hv});
  s.Ainv = Tensor({T, Hv, chunk});
  s.h = Tensor({NC, Hv, K, V});
  s.v_new = Tensor({T, Hv, V});
  out.o = Tensor({T, Hv, V});
  out.final_state = Tensor({N, Hv, K, V});
  for (Index t = 0; t < T; ++t) {
    for (Index h = 0; h < Hk; ++h) {
      auto rstd = [&](Tensor const& x) {
        return in.use_qk_l2norm ? 1.0 / std::sqrt(x.vec({t, h}).squaredNorm() + ref::kL2NormEps) : 1.0;
      };
      s.q_rstd({t, h}) = rstd(in.q);
      s.k_rstd({t, h}) = rstd(in.k);
    }
  }
  for (Chunk const& c : chunks) {
    for (Index j = 0; j < Hv; ++j) {
      double acc = 0;
      for (Index i = 0; i < c.len; ++i) s.gcum({c.start + i, j}) = acc += in.g({c.start + i, j});
    }
  }
  for (Index n = 0; n < N; ++n) {
    for (Index j = 0; j < Hv; ++j) {
      Mat h = in.initial_state.defined() ? Mat(in.initial_state.mat({n, j})) : Mat::Zero(K, V);
      for (Index ci = 0; ci < NC; ++ci) {
        Chunk const& c = chunks[ci];
        if (c.example != n) continue;
        ChunkView cv = view(in, s, c, j, false);
        Index const L = c.len;
        Mat A = intra_a_hat(cv);
        for (Index i = 0; i < L; ++i) A.row(i) *= cv.beta(i);
        Mat const Tinv = (Mat::Identity(L, L) + A).triangularView<Eigen::Lower>().solve(Mat::Identity(L, L));
        Mat kbg(L, K), vb(L, V), qg(L, K), kg(L, K);
        for (Index i = 0; i < L; ++i) {
          kbg.row(i) = cv.beta(i) * std::exp(cv.G(i)) * cv.k_hat.row(i);
          vb.row(i) = cv.beta(i) * cv.v.row(i);
          qg.row(i) = std::exp(cv.G(i)) * cv.q_hat.row(i);
          kg.row(i) = cv.to_end(i) * cv.k_hat.row(i);
        }
        Mat const w = Tinv * kbg, u = Tinv * vb;
        Mat const v_new = u - w * h;
        Mat const o = qg * h + intra_p(cv) * v_new;
        s.h.mat({ci, j}) = h;
        for (Index i = 0; i < L; ++i) {
          Index const t = c.start + i;
          s.v_new.vec({t, j}) = v_new.row(i).transpose();
          out.o.vec({t, j}) = o.row(i).transpose();
          for (Index jj = 0; jj < L; ++jj) s.Ainv({t, j, jj}) = Tinv(i, jj);
        }
        h = cv.gamma() * h + kg.transpose() * v_new;
      }
      out.final_state.mat({n, j}) = h;
    }
  }
  return out;
}

// The backward as the kernels compute it, from the inputs and the saved tensors only:
//  (a) per chunk and value head: P and Â;
//  (b) per example and value head, chunks in reverse, dh starting at dfinal_state (or 0): store dh_next (the
//      gradient of the state leaving the chunk), dv_new = Pᵀ do + Kg dh_next, y = Ainvᵀ dv_new (= the gradient of
//      β⊙v − (β⊙exp(G)⊙k̂) h, which v_new = Ainv·that), dh ← Qgᵀ do + exp(G_last) dh_next − kβgᵀ y; dinitial_state =
//      dh at the example start; dv = β ⊙ y;
//  (c) per chunk and value head, with dP = do v_newᵀ and dA = −y v_newᵀ (the gradient through Ainv collapses to this
//      outer product): dq̂, dk̂ of the value head, dβ, and dg as the reverse in-chunk cumsum of dG;
//  (d) per token and key head: dq̂, dk̂ summed over the group's value heads in head order, then the scale and the
//      l2norm backward.
ref::GatedDeltaGrads chunked_bwd(Inputs const& in, Saved const& s, Tensor const& dout, Tensor const& dfinal_state,
                                 Index chunk) {
  Index const T = in.q.size(0), Hk = in.Hk(), Hv = in.Hv(), K = in.K(), V = in.V();
  Index const N = Index(in.cu_seqlens.size()) - 1, group = Hv / Hk;
  std::vector<Chunk> const chunks = chunk_table(in.cu_seqlens, chunk);
  Index const NC = Index(chunks.size());
  auto do_of = [&](Chunk const& c, Index j) {
    Mat d(c.len, V);
    for (Index i = 0; i < c.len; ++i) d.row(i) = dout.vec({c.start + i, j}).transpose();
    return d;
  };
  auto v_new_of = [&](Chunk const& c, Index j) {
    Mat d(c.len, V);
    for (Index i = 0; i < c.len; ++i) d.row(i) = s.v_new.vec({c.start + i, j}).transpose();
    return d;
  };

  ref::GatedDeltaGrads grads{
      Tensor(in.q.shape()),    Tensor(in.k.shape()),
      Tensor(in.v.shape()),    Tensor(in.g.shape()),
      Tensor(in.beta.shape()), in.initial_state.defined() ? Tensor(in.initial_state.shape()) : Tensor()};

  // (b) the reverse chunk recurrence.
  Tensor dh_next({NC, Hv, K, V}), y_all({T, Hv, V});
  for (Index n = 0; n < N; ++n) {
    for (Index j = 0; j < Hv; ++j) {
      Mat dh = dfinal_state.defined() ? Mat(dfinal_state.mat({n, j})) : Mat::Zero(K, V);
      for (Index ci = NC - 1; ci >= 0; --ci) {
        Chunk const& c = chunks[ci];
        if (c.example != n) continue;
        ChunkView const cv = view(in, s, c, j, true);
        Mat const d_o = do_of(c, j);
        dh_next.mat({ci, j}) = dh;
        Mat kg(c.len, K), qg(c.len, K), kbg(c.len, K);
        for (Index i = 0; i < c.len; ++i) {
          kg.row(i) = cv.to_end(i) * cv.k_hat.row(i);
          qg.row(i) = std::exp(cv.G(i)) * cv.q_hat.row(i);
          kbg.row(i) = cv.beta(i) * std::exp(cv.G(i)) * cv.k_hat.row(i);
        }
        Mat const dv_new = intra_p(cv).transpose() * d_o + kg * dh;
        Mat const y = cv.T.transpose() * dv_new;
        for (Index i = 0; i < c.len; ++i) y_all.vec({c.start + i, j}) = y.row(i).transpose();
        dh = qg.transpose() * d_o + cv.gamma() * dh - kbg.transpose() * y;
      }
      if (in.initial_state.defined()) grads.dinitial_state.mat({n, j}) = dh;
    }
  }
  for (Index t = 0; t < T; ++t) {
    for (Index j = 0; j < Hv; ++j) grads.dv.vec({t, j}) = in.beta({t, j}) * y_all.vec({t, j});
  }

  // (c) per chunk and value head.
  Tensor dq_hat({T, Hv, K}), dk_hat({T, Hv, K});  // per value head, summed over the group in (d)
  for (Index ci = 0; ci < NC; ++ci) {
    Chunk const& c = chunks[ci];
    Index const L = c.len;
    for (Index j = 0; j < Hv; ++j) {
      ChunkView const cv = view(in, s, c, j, false);
      Mat const d_o = do_of(c, j), vn = v_new_of(c, j), h = s.h.mat({ci, j}), dhn = dh_next.mat({ci, j});
      Mat y(L, V);
      for (Index i = 0; i < L; ++i) y.row(i) = y_all.vec({c.start + i, j}).transpose();
      Mat const P = intra_p(cv), A_hat = intra_a_hat(cv);
      Mat const D1 = d_o * vn.transpose(), D2 = y * vn.transpose();
      Mat const S1 = d_o * h.transpose(), S2 = y * h.transpose(), S3 = vn * dhn.transpose();  // [L, K]
      Mat dP(L, L), B(L, L);  // dP ⊙ decay (i >= j); B = β_i dA_ij decay (i > j)
      Vec dG = Vec::Zero(L), dbeta = Vec::Zero(L);
      for (Index i = 0; i < L; ++i) {
        for (Index jj = 0; jj < L; ++jj) {
          double const e = cv.decay(i, jj);
          dP(i, jj) = D1(i, jj) * e;
          double const dA = i > jj ? -D2(i, jj) : 0.0;
          B(i, jj) = cv.beta(i) * dA * e;
          double const E = D1(i, jj) * P(i, jj) + dA * cv.beta(i) * A_hat(i, jj);  // dP∘P + dA∘A
          dG(i) += E;
          dG(jj) -= E;
          dbeta(i) += dA * A_hat(i, jj);
        }
      }
      Mat dq = dP * cv.k_hat, dk = dP.transpose() * cv.q_hat + (B + B.transpose()) * cv.k_hat;
      double last = cv.gamma() * (h.array() * dhn.array()).sum();
      for (Index i = 0; i < L; ++i) {
        double const Gi = std::exp(cv.G(i)), bG = cv.beta(i) * Gi, sk = cv.to_end(i);
        dq.row(i) += Gi * S1.row(i);
        dk.row(i) += -bG * S2.row(i) + sk * S3.row(i);
        double const ks3 = sk * cv.k_hat.row(i).dot(S3.row(i));
        dG(i) += Gi * cv.q_hat.row(i).dot(S1.row(i)) - bG * cv.k_hat.row(i).dot(S2.row(i)) - ks3;
        last += ks3;
        dbeta(i) += -Gi * cv.k_hat.row(i).dot(S2.row(i)) + cv.v.row(i).dot(y.row(i));
      }
      dG(L - 1) += last;
      double acc = 0;
      for (Index i = L - 1; i >= 0; --i) {
        Index const t = c.start + i;
        grads.dg({t, j}) = acc += dG(i);
        grads.dbeta({t, j}) = dbeta(i);
        dq_hat.vec({t, j}) = dq.row(i).transpose();
        dk_hat.vec({t, j}) = dk.row(i).transpose();
      }
    }
  }

  // (d) the group sum in head order, the scale, the l2norm backward: dx = r (dy − x̂ (x̂·dy)) with x̂ = r x.
  for (Index t = 0; t < T; ++t) {
    for (Index h = 0; h < Hk; ++h) {
      Vec dq = Vec::Zero(K), dk = Vec::Zero(K);
      for (Index j = h * group; j < (h + 1) * group; ++j) {
        dq += dq_hat.vec({t, j});
        dk += dk_hat.vec({t, j});
      }
      dq *= in.scale;
      auto l2norm_bwd = [&](Vec const& dy, Tensor const& x, double r) -> Vec {
        if (!in.use_qk_l2norm) return dy;
        Vec const xh = r * x.vec({t, h});
        return r * (dy - xh * xh.dot(dy));
      };
      grads.dq.vec({t, h}) = l2norm_bwd(dq, in.q, s.q_rstd({t, h}));
      grads.dk.vec({t, h}) = l2norm_bwd(dk, in.k, s.k_rstd({t, h}));
    }
  }
  return grads;
}

struct ChunkedCase {
  std::string name;
  std::vector<int> lengths;  // 0 = an empty example
  Index Hk, Hv, K, V, chunk;
  bool use_qk_l2norm, with_initial_state, with_dfinal_state;
};

void PrintTo(ChunkedCase const& c, std::ostream* os) { *os << c.name; }

// Drawn as the model feeds the op (reference/gated_delta_test.cpp does the same): g in [−1.2, 0], β in (0, 1),
// scale = K^−1/2, unit-scale q and k without l2norm.
Inputs draw(ChunkedCase const& c, std::mt19937_64& rng) {
  Inputs in;
  in.cu_seqlens = cu_seqlens_from_lengths(c.lengths);
  Index const T = in.cu_seqlens.back(), N = Index(c.lengths.size());
  double const sd = c.use_qk_l2norm ? 1.0 : 1.0 / std::sqrt(double(c.K));
  in.q = randn({T, c.Hk, c.K}, rng, sd);
  in.k = randn({T, c.Hk, c.K}, rng, sd);
  in.v = randn({T, c.Hv, c.V}, rng);
  in.g = uniform({T, c.Hv}, rng, -1.2, 0.0);
  in.beta = uniform({T, c.Hv}, rng, 0.0, 1.0);
  if (c.with_initial_state) in.initial_state = randn({N, c.Hv, c.K, c.V}, rng, 0.5);
  in.scale = 1.0 / std::sqrt(double(c.K));
  in.use_qk_l2norm = c.use_qk_l2norm;
  return in;
}

// Both sides are fp64 and compute the same function; they differ in summation order and in the chunked algebra
// (a triangular solve for Ainv, exp(G) factors split across products). With |terms| up to ~10² times the results and
// at most a few thousand terms per result, fp64 (1.1e-16 per rounding) stays below ~1e-11 of each tensor's largest
// entry; 1e-10 of it leaves room. A dropped or wrong term errs by 1e-3 of it or more (checked while writing this test:
// removing the exp(G_last)·<h, dh_next> term of dg, or the −kβgᵀ y term of the recurrence, fails every case in
// which a chunk sees a nonzero state or state gradient, by 1e9 times the tolerance or more).
constexpr double kRelToMax = 1e-10;

void expect_close(std::string const& name, Tensor const& got, Tensor const& want, std::vector<std::int32_t> const& cu,
                  bool packed_tokens) {
  double const scale = want.numel() ? want.flat().cwiseAbs().maxCoeff() : 0.0;
  FUSEPACK_EXPECT_PASS(compare_allclose(name, got, want, {kRelToMax * std::max(scale, 1e-300), 0.0},
                                        packed_tokens ? packed_layout(want, cu) : plain_layout(want)));
}

void expect_chunked_matches_recurrence(ChunkedCase const& c, std::mt19937_64& rng) {
  Inputs const in = draw(c, rng);
  ChunkedOut const fwd = chunked_fwd(in, c.chunk);
  ref::GatedDeltaOut const want = ref::gated_delta_fwd(in.q, in.k, in.v, in.g, in.beta, in.cu_seqlens, in.scale,
                                                       in.use_qk_l2norm, in.initial_state, true);
  auto const& cu = in.cu_seqlens;
  expect_close("o " + c.name, fwd.o, want.o, cu, true);
  expect_close("final_state " + c.name, fwd.final_state, want.final_state, cu, false);

  Tensor const dout = randn(want.o.shape(), rng);
  Tensor const dfinal_state = c.with_dfinal_state ? randn(want.final_state.shape(), rng) : Tensor();
  ref::GatedDeltaGrads const got = chunked_bwd(in, fwd.saved, dout, dfinal_state, c.chunk);
  ref::GatedDeltaGrads const grads = ref::gated_delta_bwd(dout, dfinal_state, in.q, in.k, in.v, in.g, in.beta, cu,
                                                          in.scale, in.use_qk_l2norm, in.initial_state);
  expect_close("dq " + c.name, got.dq, grads.dq, cu, true);
  expect_close("dk " + c.name, got.dk, grads.dk, cu, true);
  expect_close("dv " + c.name, got.dv, grads.dv, cu, true);
  expect_close("dg " + c.name, got.dg, grads.dg, cu, true);
  expect_close("dbeta " + c.name, got.dbeta, grads.dbeta, cu, true);
  ASSERT_EQ(got.dinitial_state.defined(), grads.dinitial_state.defined()) << c.name;
  if (grads.dinitial_state.defined())
    expect_close("dinitial_state " + c.name, got.dinitial_state, grads.dinitial_state, cu, false);
}

class GatedDeltaChunked : public ::testing::TestWithParam<ChunkedCase> {};

TEST_P(GatedDeltaChunked, MatchesNaiveRecurrence) {
  auto rng = test_rng();
  expect_chunked_matches_recurrence(GetParam(), rng);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GatedDeltaChunked,
    ::testing::Values(
        // name, lengths, Hk, Hv, K, V, chunk, use_qk_l2norm, with_initial_state, with_dfinal_state
        // The kernels' chunk of 64: one token, one token short of a chunk, exactly one, one over, two and a bit,
        // and an empty example in the middle.
        ChunkedCase{"c64_seqs_1_63_64_65_130_0_gqa1", {1, 63, 64, 0, 65, 130}, 1, 1, 5, 4, 64, true, true, true},
        ChunkedCase{"c64_seqs_130_0_65_gqa2_no_l2norm", {130, 0, 65}, 2, 4, 4, 3, 64, false, false, true},
        ChunkedCase{"c64_seqs_64_1_gqa3_no_states", {64, 1}, 1, 3, 6, 5, 64, true, false, false},
        // Chunks of 4: a boundary every 4 tokens, lengths around multiples of it.
        ChunkedCase{"c4_seqs_1_3_4_5_9_0_gqa2", {1, 3, 4, 5, 0, 9}, 2, 4, 5, 3, 4, true, true, true},
        ChunkedCase{"c4_seqs_0_13_8_gqa3_no_l2norm_h0", {0, 13, 8}, 1, 3, 3, 4, 4, false, true, false},
        ChunkedCase{"c4_seqs_17_gqa1_dfinal_only", {17}, 2, 2, 4, 4, 4, true, false, true},
        // Chunks of 1: the delta rule token by token (A = 0, Ainv = I); chunks of 16 over a long example.
        ChunkedCase{"c1_seqs_5_2_gqa2", {5, 2}, 1, 2, 3, 3, 1, true, true, true},
        ChunkedCase{"c16_seqs_65_31_gqa3", {65, 31}, 2, 6, 4, 3, 16, true, true, true},
        // T = 0: only empty examples; their dinitial_state is dfinal_state.
        ChunkedCase{"c64_only_empty_examples", {0, 0}, 1, 2, 3, 2, 64, true, true, true}),
    [](auto const& tc) { return tc.param.name; });

TEST(GatedDeltaChunked, MatchesNaiveRecurrenceOnRandomShapes) {
  auto rng = test_rng();
  int const chunk_sizes[] = {1, 2, 4, 8, 64};
  for (int i = 0; i < cases(4, 40); ++i) {
    ChunkedCase c;
    c.chunk = chunk_sizes[uniform_int(rng, 0, 4)];
    c.lengths = random_lengths(rng, uniform_int(rng, 1, 4), 0, c.chunk == 64 ? 140 : 3 * int(c.chunk) + 1);
    c.Hk = uniform_int(rng, 1, 2);
    c.Hv = c.Hk * uniform_int(rng, 1, 3);
    c.K = uniform_int(rng, 1, 6);
    c.V = uniform_int(rng, 1, 5);
    c.use_qk_l2norm = uniform_int(rng, 0, 1) == 1;
    c.with_initial_state = uniform_int(rng, 0, 1) == 1;
    c.with_dfinal_state = uniform_int(rng, 0, 1) == 1;
    c.name = "random case " + std::to_string(i) + " (chunk " + std::to_string(c.chunk) + ")";
    expect_chunked_matches_recurrence(c, rng);
  }
}

}  // namespace
}  // namespace fusepack::test
