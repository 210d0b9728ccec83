// Precision from the config keys, and the task's device index.
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "meshrun/device/backend.hpp"

namespace meshrun::device {

Precision Precision::cpu(const std::string& dtype) {
  if (dtype == "bf16") return cuda("bf16", "fp32", "fp32");  // the CUDA backend's mixed precision, on CPU
  if (dtype != "fp32" && dtype != "fp64")
    throw std::invalid_argument("training.dtype='" + dtype + "': the CPU backend computes in fp32, fp64 or bf16");
  DType t = dtype == "fp64" ? DType::f64 : DType::f32;
  return {t, t, t, t};
}

Precision Precision::cuda(const std::string& param, const std::string& grad, const std::string& optim) {
  // What the CUDA kernels implement; fp16 (loss scaling) and fp8 (scaling recipes) are not built.
  if (param != "bf16" && param != "fp32")
    throw std::invalid_argument("training.param_dtype='" + param +
                                "' is not supported by the CUDA backend; use bf16 (or fp32)");
  if (grad != "fp32")
    throw std::invalid_argument("training.grad_dtype='" + grad +
                                "' is not supported by the CUDA backend; use fp32 (gradients are reduced in fp32)");
  if (optim != "fp32")
    throw std::invalid_argument("training.optim_dtype='" + optim +
                                "' is not supported by the CUDA backend; use fp32 (master weights and Adam moments)");
  Precision p;
  p.param = param == "bf16" ? DType::bf16 : DType::f32;
  p.stat = DType::f32;
  p.grad = DType::f32;
  p.optim = DType::f32;
  return p;
}

Precision Precision::for_run(const std::string& device, const std::string& dtype, const std::string& param,
                             const std::string& grad, const std::string& optim) {
  if (device == "cuda") return cuda(param, grad, optim);
  if (device == "cpu") return cpu(dtype);
  throw std::invalid_argument("training.device='" + device + "' is unknown; use \"cpu\" or \"cuda\"");
}

int task_cuda_device(int visible, int default_device) {
  const char* env = std::getenv("MESHRUN_CUDA_DEVICE");
  if (!env || !*env) {
    if (default_device >= visible)
      throw std::invalid_argument("node-local rank " + std::to_string(default_device) + " has no CUDA device of its own (" +
                                  std::to_string(visible) + " visible): start one task per GPU, or set MESHRUN_CUDA_DEVICE");
    return default_device;
  }
  char* end = nullptr;
  long d = std::strtol(env, &end, 10);
  if (*end != '\0' || d < 0 || d >= visible)
    throw std::invalid_argument("MESHRUN_CUDA_DEVICE='" + std::string(env) + "' is not a device index below " +
                                std::to_string(visible) + " (the visible CUDA devices); unset it or fix CUDA_VISIBLE_DEVICES");
  return static_cast<int>(d);
}

}  // namespace meshrun::device
