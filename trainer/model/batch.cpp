#include "trainer/model/batch.h"

#include "kernels/ops/check.h"
#include "kernels/ops/host_to_device.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

namespace fusepack::model {
namespace {

// The batch's tensors are copied without waiting for the GPU (ops::host_to_device), so a step's batch is queued
// behind the previous step's work; the cu_seqlens values are noted as checked (the ops' check would otherwise copy
// them back and wait).
at::Tensor cu_seqlens_to_device(std::vector<std::int32_t> const& cu, at::Device device) {
  at::Tensor t = ops::host_to_device(cu, at::kInt, device);
  ops::note_cu_seqlens("make_model_batch", t, cu);
  return t;
}

std::int32_t max_of(std::vector<std::int32_t> const& v, std::int32_t empty) {
  return v.empty() ? empty : *std::max_element(v.begin(), v.end());
}

}  // namespace

ModelBatch make_model_batch(packing::PackedBatch const& batch, at::Device device) {
  batch.validate();
  ModelBatch b;
  b.tokens = ops::host_to_device(batch.tokens, at::kLong, device);
  b.labels = ops::host_to_device(batch.labels, at::kLong, device);
  b.position_ids = ops::host_to_device(batch.position_ids, at::kLong, device);
  b.seq_idx = ops::host_to_device(batch.seq_idx, at::kLong, device);
  b.cu_seqlens = cu_seqlens_to_device(batch.cu_seqlens, device);
  b.max_seqlen = batch.max_seqlen;
  b.num_examples = static_cast<std::int64_t>(batch.cu_seqlens.size()) - 1;
  b.num_targets = batch.num_targets();
  b.max_token = max_of(batch.tokens, -1);
  b.max_label = max_of(batch.labels, static_cast<std::int32_t>(kIgnoreIndex));
  return b;
}

ModelBatch make_model_batch(packing::PaddedBatch const& batch, at::Device device) {
  batch.validate();
  std::int64_t const B = batch.rows, L = batch.cols;
  std::vector<std::int32_t> cu(B + 1), seq_idx(B * L);
  for (std::int64_t r = 0; r <= B; ++r) cu[r] = static_cast<std::int32_t>(r * L);
  for (std::int64_t t = 0; t < B * L; ++t) seq_idx[t] = static_cast<std::int32_t>(t / L);
  ModelBatch b;
  b.tokens = ops::host_to_device(batch.tokens, at::kLong, device);
  b.labels = ops::host_to_device(batch.labels, at::kLong, device);
  b.position_ids = ops::host_to_device(batch.position_ids, at::kLong, device);
  b.seq_idx = ops::host_to_device(seq_idx, at::kLong, device);
  b.cu_seqlens = cu_seqlens_to_device(cu, device);
  b.max_seqlen = L;
  b.num_examples = B;
  b.num_targets = batch.num_targets();
  b.max_token = max_of(batch.tokens, -1);
  b.max_label = max_of(batch.labels, static_cast<std::int32_t>(kIgnoreIndex));
  return b;
}

}  // namespace fusepack::model
