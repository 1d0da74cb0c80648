// Causal softmax attention over packed examples with GQA and an optional output gate, fp64 reference.
// Query head h reads key/value head h / (Hq / Hkv). For token t of an example starting at token s0:
//   o[t, h] = Σ_{s0 <= s <= t} softmax_s(scale · q[t, h]·k[s, h_kv]) · v[s, h_kv]
// and with a gate: o[t, h] ← o[t, h] · sigmoid(gate[t, h]). Tokens never see another example.
#pragma once

#include "reference/tensor.h"

#include <cstdint>
#include <vector>

namespace fusepack::ref {

struct AttentionGrads {
  Tensor dq;     // [T, Hq, D]
  Tensor dk;     // [T, Hkv, D]
  Tensor dv;     // [T, Hkv, Dv]
  Tensor dgate;  // [T, Hq, Dv]; defined only when a gate was given
};

// q: [T, Hq, D]; k: [T, Hkv, D]; v: [T, Hkv, Dv]; Hq a multiple of Hkv; cu_seqlens: [N+1]; scale > 0
// (Qwen3.5: D^−1/2); gate: optional [T, Hq, Dv].
Tensor attention_fwd(Tensor const& q, Tensor const& k, Tensor const& v, std::vector<std::int32_t> const& cu_seqlens,
                     double scale, Tensor const& gate = {});
AttentionGrads attention_bwd(Tensor const& dout, Tensor const& q, Tensor const& k, Tensor const& v,
                             std::vector<std::int32_t> const& cu_seqlens, double scale, Tensor const& gate = {});

}  // namespace fusepack::ref
