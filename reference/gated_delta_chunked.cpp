#include "reference/gated_delta_chunked.h"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fusepack::ref {
namespace {

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

ChunkView view(GatedDeltaChunkedInputs const& in, GatedDeltaChunkedSaved const& s, Chunk const& c, Index j, bool with_T) {
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

// m as a kernel's product reads it: each entry through `as_read` (unset: exact).
Mat read_as(Mat m, std::function<double(double)> const& as_read) {
  if (as_read) m = m.unaryExpr(as_read);
  return m;
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

// A chunk's map of the state, from the inputs alone: with h the state entering the chunk,
//   v_new = u − w·h,  o = qg·h + P·v_new,  h_next = γ·h + kgᵀ·v_new,
// Tinv = (I + A)^-1, w = Tinv (β ⊙ exp(G) ⊙ k̂), u = Tinv (β ⊙ v), qg = exp(G) ⊙ q̂, kg = exp(G_last − G) ⊙ k̂,
// γ = exp(G_last). h_next is affine in h: (γ I − kgᵀ w) h + kgᵀ u.
struct ChunkMap {
  Mat Tinv, w, u, qg, kg;
  double gamma;
};
// The chunk's rows scaled by their decays, which both passes read: qg, kg, and kbg = β ⊙ exp(G) ⊙ k̂ (w's operand).
struct ChunkRows {
  Mat qg, kg, kbg;
};
ChunkRows chunk_rows(ChunkView const& cv) {
  Index const L = cv.L, K = cv.k_hat.cols();
  ChunkRows r{Mat(L, K), Mat(L, K), Mat(L, K)};
  for (Index i = 0; i < L; ++i) {
    r.qg.row(i) = std::exp(cv.G(i)) * cv.q_hat.row(i);
    r.kg.row(i) = cv.to_end(i) * cv.k_hat.row(i);
    r.kbg.row(i) = cv.beta(i) * std::exp(cv.G(i)) * cv.k_hat.row(i);
  }
  return r;
}
ChunkMap chunk_map(ChunkView const& cv) {
  Index const L = cv.L, V = cv.v.cols();
  Mat A = intra_a_hat(cv);
  for (Index i = 0; i < L; ++i) A.row(i) *= cv.beta(i);
  ChunkMap m;
  m.Tinv = (Mat::Identity(L, L) + A).triangularView<Eigen::Lower>().solve(Mat::Identity(L, L));
  ChunkRows rows = chunk_rows(cv);
  Mat vb(L, V);
  for (Index i = 0; i < L; ++i) vb.row(i) = cv.beta(i) * cv.v.row(i);
  m.qg = std::move(rows.qg);
  m.kg = std::move(rows.kg);
  m.w = m.Tinv * rows.kbg;
  m.u = m.Tinv * vb;
  m.gamma = cv.gamma();
  return m;
}

// rstd (per token and key head) and gcum (the in-chunk cumulative g) into `s`, sized for T tokens.
void save_row_terms(GatedDeltaChunkedInputs const& in, std::vector<Chunk> const& chunks, GatedDeltaChunkedSaved& s) {
  Index const T = in.q.size(0), Hk = in.Hk(), Hv = in.Hv();
  s.q_rstd = Tensor({T, Hk});
  s.k_rstd = Tensor({T, Hk});
  s.gcum = Tensor({T, Hv});
  for (Index t = 0; t < T; ++t) {
    for (Index h = 0; h < Hk; ++h) {
      auto rstd = [&](Tensor const& x) {
        return in.use_qk_l2norm ? 1.0 / std::sqrt(x.vec({t, h}).squaredNorm() + kL2NormEps) : 1.0;
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
}

// The forward's outputs and saved tensors, allocated (rstd and gcum filled), before any chunk runs.
GatedDeltaChunkedOut fwd_outputs(GatedDeltaChunkedInputs const& in, std::vector<Chunk> const& chunks, Index chunk) {
  Index const T = in.q.size(0), Hv = in.Hv(), K = in.K(), V = in.V();
  Index const N = Index(in.cu_seqlens.size()) - 1, NC = Index(chunks.size());
  GatedDeltaChunkedOut out;
  save_row_terms(in, chunks, out.saved);
  out.saved.Ainv = Tensor({T, Hv, chunk});
  out.saved.h = Tensor({NC, Hv, K, V});
  out.saved.v_new = Tensor({T, Hv, V});
  out.o = Tensor({T, Hv, V});
  out.final_state = Tensor({N, Hv, K, V});
  return out;
}

// Chunks [first, last) of the table (consecutive chunks of one example) for value head j, from the state h entering
// `first`: their o, saved h, v_new and Ainv into `out`; returns the state leaving chunk last − 1.
Mat run_chunks(GatedDeltaChunkedInputs const& in, std::vector<Chunk> const& chunks, Index first, Index last, Index j,
               Mat h, GatedDeltaChunkedFwdOperands const& operands, GatedDeltaChunkedOut& out) {
  GatedDeltaChunkedSaved& s = out.saved;
  for (Index ci = first; ci < last; ++ci) {
    Chunk const& c = chunks[ci];
    ChunkView const cv = view(in, s, c, j, false);
    ChunkMap const m = chunk_map(cv);
    Mat const v_new = m.u - m.w * read_as(h, operands.state), v_new_read = read_as(v_new, operands.v_new);
    Mat const o = m.qg * read_as(h, operands.state_out) + intra_p(cv) * v_new_read;
    s.h.mat({ci, j}) = h;
    for (Index i = 0; i < c.len; ++i) {
      Index const t = c.start + i;
      s.v_new.vec({t, j}) = v_new.row(i).transpose();
      out.o.vec({t, j}) = o.row(i).transpose();
      for (Index jj = 0; jj < c.len; ++jj) s.Ainv({t, j, jj}) = m.Tinv(i, jj);
    }
    h = read_as(m.gamma * h + m.kg.transpose() * v_new_read, operands.carry);
  }
  return h;
}

// Example n's chunks: [first, last) of the table (the table lists each example's chunks together, in order).
std::pair<Index, Index> example_chunks(std::vector<Chunk> const& chunks, Index n) {
  Index first = 0;
  while (first < Index(chunks.size()) && chunks[first].example < n) ++first;
  Index last = first;
  while (last < Index(chunks.size()) && chunks[last].example == n) ++last;
  return {first, last};
}

Mat initial_state_of(GatedDeltaChunkedInputs const& in, Index n, Index j) {
  return in.initial_state.defined() ? Mat(in.initial_state.mat({n, j})) : Mat::Zero(in.K(), in.V());
}

void check_segments(Index segments, char const* who) {
  if (segments < 1) {
    throw std::invalid_argument(std::string(who) + ": segments must be >= 1; got " + std::to_string(segments));
  }
}

// Segment s of an example's chunks [first, last), up to `segments` of them: chunks [bounds[s], bounds[s + 1]).
std::vector<Index> segment_bounds(Index first, Index last, Index segments) {
  Index const per = std::max<Index>(1, (last - first + segments - 1) / segments);  // chunks per segment
  std::vector<Index> bounds;
  for (Index c = first; c < last; c += per) bounds.push_back(c);
  bounds.push_back(last);
  return bounds;
}

// One chunk's reverse step for value head j: from dh, the gradient of the state leaving the chunk, and the chunk's
// output gradient d_o (one column per column of dh), its y = Ainvᵀ dv_new with dv_new = Pᵀ d_o + kg dh, and the
// gradient of the state entering it, qgᵀ d_o + γ dh − kβgᵀ y: affine in dh, so it maps a [K, X] gradient for any X.
Mat reverse_chunk(GatedDeltaChunkedInputs const& in, GatedDeltaChunkedSaved const& s, Chunk const& c, Index j,
                  Mat const& d_o, Mat const& dh, Mat& y) {
  ChunkView const cv = view(in, s, c, j, true);
  ChunkRows const r = chunk_rows(cv);
  Mat const dv_new = intra_p(cv).transpose() * d_o + r.kg * dh;
  y = cv.T.transpose() * dv_new;
  return r.qg.transpose() * d_o + cv.gamma() * dh - r.kbg.transpose() * y;
}

}  // namespace

// The forward, chunk by chunk: rstd, gcum, Ainv = (I + A)^-1, h (the state entering each chunk), v_new = u − w·h,
// o = (q̂ ⊙ exp(G)) h + P v_new, h_next = exp(G_last) h + (k̂ ⊙ exp(G_last − G))ᵀ v_new.
GatedDeltaChunkedOut gated_delta_chunked_fwd(GatedDeltaChunkedInputs const& in, Index chunk,
                                             GatedDeltaChunkedFwdOperands const& operands) {
  std::vector<Chunk> const chunks = chunk_table(in.cu_seqlens, chunk);
  GatedDeltaChunkedOut out = fwd_outputs(in, chunks, chunk);
  Index const N = Index(in.cu_seqlens.size()) - 1;
  for (Index n = 0; n < N; ++n) {
    auto const [first, last] = example_chunks(chunks, n);
    for (Index j = 0; j < in.Hv(); ++j) {
      out.final_state.mat({n, j}) = run_chunks(in, chunks, first, last, j, initial_state_of(in, n, j), operands, out);
    }
  }
  return out;
}

// The forward over segments of each example's chunks, in three phases that a GPU would run as three passes:
//  (1) every segment but the last on its own: its map of the state, h_end = M h_start + b, from its chunks' maps alone
//      (M ← (γ I − kgᵀ w) M and b ← γ b + kgᵀ (u − w b) chunk by chunk, from M = I, b = 0: the state chain run from
//      the identity with u = 0, and from zero with the real u);
//  (2) the segments' true starts, h_start(s + 1) = M_s h_start(s) + b_s from the example's initial state;
//  (3) every segment's chunks from its true start, as gated_delta_chunked_fwd runs them.
GatedDeltaChunkedOut gated_delta_chunked_fwd_segmented(GatedDeltaChunkedInputs const& in, Index chunk,
                                                       Index segments) {
  check_segments(segments, "gated_delta_chunked_fwd_segmented");
  std::vector<Chunk> const chunks = chunk_table(in.cu_seqlens, chunk);
  GatedDeltaChunkedOut out = fwd_outputs(in, chunks, chunk);
  Index const N = Index(in.cu_seqlens.size()) - 1, K = in.K(), V = in.V();
  for (Index n = 0; n < N; ++n) {
    auto const [first, last] = example_chunks(chunks, n);
    std::vector<Index> const bounds = segment_bounds(first, last, segments);
    Index const S = Index(bounds.size()) - 1;
    for (Index j = 0; j < in.Hv(); ++j) {
      std::vector<Mat> M(S, Mat::Identity(K, K)), b(S, Mat::Zero(K, V));
      for (Index sg = 0; sg + 1 < S; ++sg) {  // (1): the last segment's map is not needed
        for (Index ci = bounds[sg]; ci < bounds[sg + 1]; ++ci) {
          ChunkMap const m = chunk_map(view(in, out.saved, chunks[ci], j, false));
          M[sg] = m.gamma * M[sg] - m.kg.transpose() * (m.w * M[sg]);
          b[sg] = m.gamma * b[sg] + m.kg.transpose() * (m.u - m.w * b[sg]);
        }
      }
      std::vector<Mat> start(std::max<Index>(S, 1));  // (2)
      start[0] = initial_state_of(in, n, j);
      for (Index sg = 0; sg + 1 < S; ++sg) start[sg + 1] = M[sg] * start[sg] + b[sg];
      Mat h = start[0];  // (3); the last segment's run leaves the final state
      for (Index sg = 0; sg < S; ++sg) h = run_chunks(in, chunks, bounds[sg], bounds[sg + 1], j, start[sg], {}, out);
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
namespace {

// The backward; step (b) over up to `segments` segments of each example's chunks (1: the plain reverse chain).
GatedDeltaGrads chunked_bwd(GatedDeltaChunkedInputs const& in, GatedDeltaChunkedSaved const& s, Tensor const& dout,
                            Tensor const& dfinal_state, Index chunk, GatedDeltaChunkedOperands const& operands,
                            Index segments) {
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

  GatedDeltaGrads grads{
      Tensor(in.q.shape()),    Tensor(in.k.shape()),
      Tensor(in.v.shape()),    Tensor(in.g.shape()),
      Tensor(in.beta.shape()), in.initial_state.defined() ? Tensor(in.initial_state.shape()) : Tensor()};

  // (b) the reverse chunk recurrence, over segments of each example's chunks: each segment's map of the gradient,
  // dh_start = R dh_end + r (R from the identity with no output gradient, r from zero), then the segments' end
  // gradients by a scan from dfinal_state, then each segment's chunks from its end (one segment: the chain itself).
  Tensor dh_next({NC, Hv, K, V}), y_all({T, Hv, V});
  // Chunks [first, last) in reverse from dh, the gradient of the state leaving chunk last − 1: dh_next and y of each
  // into the tensors above; returns the gradient of the state entering `first`.
  auto reverse_chunks = [&](Index first, Index last, Index j, Mat dh) {
    for (Index ci = last - 1; ci >= first; --ci) {
      Chunk const& c = chunks[ci];
      dh_next.mat({ci, j}) = dh;
      Mat y;
      dh = reverse_chunk(in, s, c, j, do_of(c, j), dh, y);
      for (Index i = 0; i < c.len; ++i) y_all.vec({c.start + i, j}) = y.row(i).transpose();
    }
    return dh;
  };
  for (Index n = 0; n < N; ++n) {
    auto const [first, last] = example_chunks(chunks, n);
    std::vector<Index> const bounds = segment_bounds(first, last, segments);
    Index const S = Index(bounds.size()) - 1;
    for (Index j = 0; j < Hv; ++j) {
      // [R | r] of each segment but the first (whose map is not needed): one reverse pass over [I | 0] with the
      // output gradient [0 | do], the step being affine column by column.
      std::vector<Mat> Rr(S);
      for (Index sg = 1; sg < S; ++sg) {
        Rr[sg] = Mat::Zero(K, K + V);
        Rr[sg].leftCols(K).setIdentity();
        for (Index ci = bounds[sg + 1] - 1; ci >= bounds[sg]; --ci) {
          Chunk const& c = chunks[ci];
          Mat d_o = Mat::Zero(c.len, K + V), y;
          d_o.rightCols(V) = do_of(c, j);
          Rr[sg] = reverse_chunk(in, s, c, j, d_o, Rr[sg], y);
        }
      }
      std::vector<Mat> end(std::max<Index>(S, 1));  // end[sg]: the gradient of the state leaving segment sg
      end[std::max<Index>(S, 1) - 1] = dfinal_state.defined() ? Mat(dfinal_state.mat({n, j})) : Mat::Zero(K, V);
      for (Index sg = S - 1; sg > 0; --sg) end[sg - 1] = Rr[sg].leftCols(K) * end[sg] + Rr[sg].rightCols(V);
      Mat dh = end[0];
      for (Index sg = S - 1; sg >= 0; --sg) dh = reverse_chunks(bounds[sg], bounds[sg + 1], j, end[sg]);
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
      Mat const vn1 = read_as(vn, operands.intermediate), y1 = read_as(y, operands.intermediate),
                h1 = read_as(h, operands.intermediate);
      Mat const D1 = d_o * vn1.transpose(), D2 = y1 * vn1.transpose();
      Mat const S1 = d_o * h1.transpose(), S2 = y1 * h1.transpose(),
                S3 = read_as(vn, operands.vn_dh) * read_as(dhn, operands.vn_dh).transpose();  // [L, K]
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
        dbeta(i) += -Gi * cv.k_hat.row(i).dot(S2.row(i)) + cv.v.row(i).dot(y1.row(i));
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

}  // namespace

GatedDeltaGrads gated_delta_chunked_bwd(GatedDeltaChunkedInputs const& in, GatedDeltaChunkedSaved const& s,
                                        Tensor const& dout, Tensor const& dfinal_state, Index chunk,
                                        GatedDeltaChunkedOperands const& operands) {
  return chunked_bwd(in, s, dout, dfinal_state, chunk, operands, 1);
}

GatedDeltaGrads gated_delta_chunked_bwd_segmented(GatedDeltaChunkedInputs const& in, GatedDeltaChunkedSaved const& s,
                                                  Tensor const& dout, Tensor const& dfinal_state, Index chunk,
                                                  Index segments) {
  check_segments(segments, "gated_delta_chunked_bwd_segmented");
  return chunked_bwd(in, s, dout, dfinal_state, chunk, {}, segments);
}

}  // namespace fusepack::ref
