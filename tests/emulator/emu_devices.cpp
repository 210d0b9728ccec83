// Prints the device count the emulated runtime reports and cudaGetDeviceCount's status (test_emulator.cpp).
#include <cuda_runtime_api.h>

#include <cstdio>

int main() {
  int n = -1;
  const cudaError_t e = cudaGetDeviceCount(&n);
  std::printf("%d %s\n", n, cudaGetErrorName(e));
  return 0;
}
