// The trainer at world 1 on a backend handed to it (what meshrun-gpu-check runs on the GPU), here on the
// CPU backends: the fp32 run follows the fp64 run, training lowers the loss, the run is deterministic, and
// its parameter count is the one the device check's formula gives.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "meshrun/device/check.hpp"
#include "meshrun/train/run/single_device.hpp"

using namespace meshrun;
using namespace meshrun::train;

TEST_CASE("single device: fp32 follows fp64, training lowers the loss, runs repeat bit for bit", "[trainer]") {
  device::ModelConfig c = device::tiny_model();
  c.layers = 2;
  c.seq = 32;
  const std::vector<double> a = train_losses(device::make_cpu_backend("fp32"), c, 12),
                            b = train_losses(device::make_cpu_backend("fp64"), c, 12);
  for (int s = 0; s < 3; ++s) CHECK(std::abs(a[s] - b[s]) <= 1e-5 * b[s]);
  CHECK(std::abs(a[0] - std::log(256.0)) < 0.1);   // near-uniform prediction at the start
  CHECK(a[11] < a[0] - 0.5);
  CHECK(train_losses(device::make_cpu_backend("fp32"), c, 2) == std::vector<double>(a.begin(), a.begin() + 2));
  // A different seed is a different run (the comparison above can fail).
  CHECK(train_losses(device::make_cpu_backend("fp32"), c, 2, 2) != std::vector<double>(a.begin(), a.begin() + 2));
}

TEST_CASE("single device: the trainer holds exactly the device check's parameter count", "[trainer]") {
  const device::ModelConfig c = device::tiny_model();
  SingleDeviceRun run(single_device_config(c, 1, 1e-3, 1), device::make_cpu_backend("fp32"));
  CHECK(run.trainer().table().global_size() == device::param_count(c));
  CHECK(run.trainer().backend().name() == "cpu-fp32");
  CHECK_THROWS_WITH(single_device_config(device::ModelConfig{11, 8, 2, 3, 1, 12, 5, 2}, 1, 1e-3, 1),
                    Catch::Contains("multiple of heads"));
}
