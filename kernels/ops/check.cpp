#include "kernels/ops/check.h"

#include "kernels/ops/backend.h"

#include <c10/util/Exception.h>

#include <deque>
#include <sstream>

namespace fusepack::ops {

static std::string sizes_str(std::vector<int64_t> const& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

void check_sizes(char const* op, char const* name, at::Tensor const& t, std::vector<int64_t> const& sizes) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is required but was not given");
  TORCH_CHECK(t.dim() == static_cast<int64_t>(sizes.size()), op, ": ", name, " must have ", sizes.size(),
              " dimensions (expected ", sizes_str(sizes), ", -1 = any); got shape ", t.sizes());
  for (size_t d = 0; d < sizes.size(); ++d) {
    TORCH_CHECK(sizes[d] < 0 || t.size(d) == sizes[d], op, ": ", name, " has shape ", t.sizes(), "; expected ",
                sizes[d], " in dimension ", d, " (expected ", sizes_str(sizes), ", -1 = any)");
  }
}

void check_same_dtype_device(char const* op, char const* name, at::Tensor const& t, char const* like_name,
                             at::Tensor const& like) {
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), op, ": ", name, " has dtype ", t.scalar_type(), " but ",
              like_name, " has ", like.scalar_type(), "; they must match");
  TORCH_CHECK(t.device() == like.device(), op, ": ", name, " is on ", t.device(), " but ", like_name, " is on ",
              like.device(), "; they must be on the same device");
}

void check_fused_input(char const* op, char const* name, at::Tensor const& t) {
  TORCH_CHECK(fused_kernels_built(), op, ": the fused backend was requested but this build of fusepack has no CUDA "
              "kernels (configure with nvcc available)");
  TORCH_CHECK(t.defined(), op, ": ", name, " is required but was not given");
  TORCH_CHECK(t.is_cuda(), op, ": the fused kernel needs ", name, " on a CUDA device; got ", t.device());
  TORCH_CHECK(t.is_contiguous(), op, ": the fused kernel needs ", name, " contiguous; got strides ", t.strides(),
              " for shape ", t.sizes());
  auto const s = t.scalar_type();
  TORCH_CHECK(s == at::kFloat || s == at::kBFloat16 || s == at::kHalf, op, ": the fused kernel supports fp32, bf16 "
              "and fp16; ", name, " is ", s);
}

namespace {

// The last cu_seqlens that passed (a few: a step's micro-batches are made before its first forward), each held by
// reference so its memory cannot be reused by another tensor: every layer of a step passes the same tensor, and only
// the first call pays the device-to-host copy (a stream sync). A tensor's version counter changes with any in-place
// write, so a modified tensor is checked again.
struct ValidatedCuSeqlens {
  at::Tensor tensor;
  int64_t version = -1;
  int64_t T = -1;
  std::vector<int32_t> values;
};
constexpr std::size_t kValidatedKept = 16;
thread_local std::deque<ValidatedCuSeqlens> validated;

ValidatedCuSeqlens const* find_validated(at::Tensor const& cu_seqlens) {
  for (ValidatedCuSeqlens const& v : validated) {
    if (v.tensor.is_same(cu_seqlens) && v.version == cu_seqlens._version()) return &v;
  }
  return nullptr;
}

void remember_validated(ValidatedCuSeqlens v) {
  validated.push_front(std::move(v));
  if (validated.size() > kValidatedKept) validated.pop_back();
}

void check_cu_seqlens_values(char const* op, int32_t const* cu, int64_t n, int64_t T) {
  TORCH_CHECK(cu[0] == 0, op, ": cu_seqlens must start at 0; got cu_seqlens[0]=", cu[0]);
  for (int64_t i = 0; i + 1 < n; ++i) {
    TORCH_CHECK(cu[i] <= cu[i + 1], op, ": cu_seqlens must be non-decreasing; got cu_seqlens[", i, "]=", cu[i],
                " > cu_seqlens[", i + 1, "]=", cu[i + 1]);
  }
  TORCH_CHECK(cu[n - 1] == T, op, ": cu_seqlens must end at the number of tokens T=", T, "; got cu_seqlens[", n - 1,
              "]=", cu[n - 1]);
}

void check_cu_seqlens_tensor(char const* op, at::Tensor const& cu_seqlens) {
  TORCH_CHECK(cu_seqlens.defined(), op, ": cu_seqlens is required but was not given");
  TORCH_CHECK(cu_seqlens.scalar_type() == at::kInt, op, ": cu_seqlens must be int32; got ", cu_seqlens.scalar_type());
  TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.size(0) >= 2, op,
              ": cu_seqlens must be 1-D with at least 2 entries (one example); got shape ", cu_seqlens.sizes());
}

}  // namespace

std::vector<int32_t> check_cu_seqlens(char const* op, at::Tensor const& cu_seqlens, int64_t T) {
  TORCH_CHECK(cu_seqlens.defined(), op, ": cu_seqlens is required but was not given");
  bool const cacheable = !cu_seqlens.is_inference();
  if (cacheable) {
    if (ValidatedCuSeqlens const* v = find_validated(cu_seqlens); v != nullptr && v->T == T) return v->values;
  }
  check_cu_seqlens_tensor(op, cu_seqlens);
  at::Tensor const host = cu_seqlens.to(at::kCPU).contiguous();
  check_cu_seqlens_values(op, host.data_ptr<int32_t>(), host.size(0), T);
  std::vector<int32_t> values(host.data_ptr<int32_t>(), host.data_ptr<int32_t>() + host.size(0));
  if (cacheable) remember_validated({cu_seqlens, cu_seqlens._version(), T, values});
  return values;
}

void note_cu_seqlens(char const* op, at::Tensor const& cu_seqlens, std::vector<int32_t> values) {
  check_cu_seqlens_tensor(op, cu_seqlens);
  TORCH_CHECK(static_cast<int64_t>(values.size()) == cu_seqlens.size(0), op, ": ", values.size(),
              " cu_seqlens values noted for a tensor of ", cu_seqlens.size(0));
  TORCH_CHECK(!cu_seqlens.is_inference(), op, ": an inference tensor has no version counter; its cu_seqlens cannot "
              "be noted");
  int64_t const T = values.back();
  check_cu_seqlens_values(op, values.data(), static_cast<int64_t>(values.size()), T);
  remember_validated({cu_seqlens, cu_seqlens._version(), T, std::move(values)});
}

}  // namespace fusepack::ops
