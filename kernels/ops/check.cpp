#include "kernels/ops/check.h"

#include "kernels/ops/backend.h"

#include <c10/util/Exception.h>

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

// The last cu_seqlens that passed, held by reference so its memory cannot be reused by another tensor: every layer of
// a step passes the same tensor, and only the first call pays the device-to-host copy (a stream sync). Its version
// counter changes with any in-place write, so a modified tensor is checked again.
struct ValidatedCuSeqlens {
  at::Tensor tensor;
  int64_t version = -1;
  int64_t T = -1;
  std::vector<int32_t> values;
};
thread_local ValidatedCuSeqlens last_validated;

}  // namespace

std::vector<int32_t> check_cu_seqlens(char const* op, at::Tensor const& cu_seqlens, int64_t T) {
  TORCH_CHECK(cu_seqlens.defined(), op, ": cu_seqlens is required but was not given");
  bool const cacheable = !cu_seqlens.is_inference();
  if (cacheable && last_validated.tensor.defined() && last_validated.tensor.is_same(cu_seqlens) &&
      last_validated.version == cu_seqlens._version() && last_validated.T == T) {
    return last_validated.values;
  }
  TORCH_CHECK(cu_seqlens.scalar_type() == at::kInt, op, ": cu_seqlens must be int32; got ", cu_seqlens.scalar_type());
  TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.size(0) >= 2, op,
              ": cu_seqlens must be 1-D with at least 2 entries (one example); got shape ", cu_seqlens.sizes());
  at::Tensor const host = cu_seqlens.to(at::kCPU).contiguous();
  int32_t const* cu = host.data_ptr<int32_t>();
  int64_t const n = host.size(0);
  TORCH_CHECK(cu[0] == 0, op, ": cu_seqlens must start at 0; got cu_seqlens[0]=", cu[0]);
  for (int64_t i = 0; i + 1 < n; ++i) {
    TORCH_CHECK(cu[i] <= cu[i + 1], op, ": cu_seqlens must be non-decreasing; got cu_seqlens[", i, "]=", cu[i],
                " > cu_seqlens[", i + 1, "]=", cu[i + 1]);
  }
  TORCH_CHECK(cu[n - 1] == T, op, ": cu_seqlens must end at the number of tokens T=", T, "; got cu_seqlens[", n - 1,
              "]=", cu[n - 1]);
  std::vector<int32_t> values(cu, cu + n);
  if (cacheable) last_validated = {cu_seqlens, cu_seqlens._version(), T, values};
  return values;
}

}  // namespace fusepack::ops
