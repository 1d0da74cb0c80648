#include "verify/torch_bridge.h"

#include <ATen/ATen.h>

#ifdef FUSEPACK_WITH_CUDA_KERNELS
#include <cuda_runtime.h>
#endif

#include <stdexcept>

namespace fusepack::verify {

ref::Tensor to_ref(at::Tensor const& t) {
  at::Tensor const h = t.detach().to(at::kCPU, at::kDouble).contiguous();
  ref::Tensor r(ref::Shape(h.sizes().begin(), h.sizes().end()));
  std::copy(h.data_ptr<double>(), h.data_ptr<double>() + h.numel(), r.data());
  return r;
}

at::Tensor to_torch(ref::Tensor const& t, at::ScalarType dtype, at::Device device) {
  at::Tensor h = at::empty(std::vector<int64_t>(t.shape().begin(), t.shape().end()), at::kDouble);
  std::copy(t.data(), t.data() + t.numel(), h.data_ptr<double>());
  return h.to(device, dtype).contiguous();
}

at::ScalarType scalar_type(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF64: return at::kDouble;
    case Dtype::kF32: return at::kFloat;
    case Dtype::kF16: return at::kHalf;
    case Dtype::kBF16: return at::kBFloat16;
  }
  throw std::invalid_argument("scalar_type: unknown dtype");
}

Dtype test_dtype(at::ScalarType type) {
  switch (type) {
    case at::kDouble: return Dtype::kF64;
    case at::kFloat: return Dtype::kF32;
    case at::kHalf: return Dtype::kF16;
    case at::kBFloat16: return Dtype::kBF16;
    default: break;
  }
  throw std::invalid_argument(std::string("test_dtype: no test dtype for ") + c10::toString(type));
}

bool cuda_device_available(std::string* why) {
#ifdef FUSEPACK_WITH_CUDA_KERNELS
  int count = 0;
  cudaError_t const status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) return true;
  if (why) {
    *why = std::string("no CUDA device: cudaGetDeviceCount returned ") + cudaGetErrorName(status) + " with " +
           std::to_string(count) + " devices";
  }
  return false;
#else
  if (why) *why = "this build of fusepack has no CUDA kernels (nvcc was not found at configure time)";
  return false;
#endif
}

ErrorReport check_fused(std::string const& name, at::Tensor const& fused, at::Tensor const& composite,
                        ref::Tensor const& ref, IndexLayout const& layout, std::optional<Dtype> run_dtype) {
  ref::Tensor const got = to_ref(fused), base = to_ref(composite);
  if (got.shape() != ref.shape() || base.shape() != ref.shape()) {
    throw std::invalid_argument("check_fused " + name + ": shapes " + ref::shape_str(got.shape()) + " (fused), " +
                                ref::shape_str(base.shape()) + " (composite), " + ref::shape_str(ref.shape()) +
                                " (reference) differ");
  }
  Dtype const dtype = test_dtype(fused.scalar_type());
  double const floor = rounding_step(dtype, ref.flat().cwiseAbs().maxCoeff());
  Dtype const run = run_dtype.value_or(dtype);
  std::string const label = name + " " + dtype_name(dtype) + (run != dtype ? std::string(" of a ") + dtype_name(run) + " run" : std::string());
  ErrorReport r = compare_with_baseline(label, got.data(), base.data(), ref.data(), ref.numel(), floor,
                                        layout.shape.empty() ? plain_layout(ref) : layout);
  if (run == Dtype::kF32 && r.rel_rms > kFp32RelRms) {
    r.failed_bound = "rel_rms " + std::to_string(r.rel_rms) + " > " + std::to_string(kFp32RelRms) + " (fp32 bound)";
  }
  return r;
}

}  // namespace fusepack::verify
