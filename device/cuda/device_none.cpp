// A build without the CUDA backend (MESHRUN_CUDA=OFF, or AUTO without the toolkit).
#include <stdexcept>

#include "meshrun/device/backend.hpp"

namespace meshrun::device {

bool cuda_compiled() { return false; }

int cuda_device_count(std::string* why) {
  if (why) *why = "this build has no CUDA backend (configure with -DMESHRUN_CUDA=ON, docs/gpu.md)";
  return 0;
}

std::string cuda_current_device_name() { return ""; }

std::unique_ptr<Backend> make_cuda_backend(const Precision&, int) {
  throw std::invalid_argument("this build has no CUDA backend (configure with -DMESHRUN_CUDA=ON, docs/gpu.md)");
}

}  // namespace meshrun::device
