// Device discovery for CUDA builds: how many devices the runtime sees (CUDA_VISIBLE_DEVICES applies).
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>

#include "meshrun/device/backend.hpp"

namespace meshrun::device {

bool cuda_compiled() { return true; }

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) {
      const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
      *why = std::string(e != cudaSuccess ? cudaGetErrorString(e) : "the CUDA runtime reports 0 devices") +
             " (CUDA_VISIBLE_DEVICES=" + (vis ? std::string("'") + vis + "'" : "unset") +
             "); run on a GPU node, or use training.device = \"cpu\"";
    }
    return 0;
  }
  return n;
}

std::string cuda_current_device_name() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  return prop.name;
}

}  // namespace meshrun::device
