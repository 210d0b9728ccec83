// The pieces of meshrun-gpu-check (docs/gpu.md) that do not need a GPU, so they are tested here:
// argument parsing, the model presets and the kernel-vs-twin comparison. (The training runs go through
// the trainer: trainer/include/meshrun/train/run/single_device.hpp.)
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "meshrun/device/backend.hpp"
#include "meshrun/device/model_config.hpp"

namespace meshrun::device {

struct CheckOptions {
  bool kernels = true, tiny = true, perf = true;   // the three parts; --only picks one
  bool dry_run = false;                            // print the plan (sizes, FLOPs) and touch no device
  bool help = false;
  int tiny_steps = 8;
  int perf_steps = 30, perf_warmup = 3;
  ModelConfig perf_model = ModelConfig{32000, 2048, 16, 16, 8, 8192, 2048, 8};   // ~1.14B parameters
  double peak_tflops = 989.0;                      // H200 SXM dense bf16
};

// Parses argv; throws std::invalid_argument with one line naming the bad argument and the fix.
CheckOptions parse_check_args(int argc, const char* const* argv);
extern const char* const kCheckUsage;

// The tiny model of the loss comparison (4 layers, d = 128, GQA, byte vocabulary).
ModelConfig tiny_model();

// One kernel compared with its twin: max abs error, ‖test − ref‖₂ / ‖ref‖₂ and the bound it must meet.
struct KernelResult {
  std::string name;
  double max_abs = 0, rel = 0, bound = 0;
  bool pass() const { return rel <= bound; }   // NaN fails
};
// Runs every Backend kernel on `test` and on `ref` with the same random inputs (rounded to the test
// backend's weight/activation dtype first, so only the kernels' own error is measured). `bound` is the
// relative bound for every output.
std::vector<KernelResult> compare_kernels(Backend& test, Backend& ref, double bound);

// The bound compare_kernels uses for a test backend of this precision: 2e-2 for bf16 activations
// (8-bit significand: one rounding is ≤ 2^-9 relative, and a kernel rounds a few times), 1e-4 for fp32
// (summation order only).
double kernel_bound(const Precision& p);

}  // namespace meshrun::device
