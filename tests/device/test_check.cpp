// meshrun-gpu-check's harness: arguments, and the kernel comparison run between two CPU twins.
#include <catch2/catch.hpp>
#include <vector>

#include "meshrun/device/check.hpp"

using namespace meshrun::device;

namespace {
CheckOptions parse(std::vector<const char*> a) {
  a.insert(a.begin(), "meshrun-gpu-check");
  return parse_check_args(static_cast<int>(a.size()), a.data());
}
}  // namespace

TEST_CASE("check: arguments", "[check]") {
  const CheckOptions d = parse({});
  CHECK((d.kernels && d.tiny && d.perf && !d.dry_run));
  const CheckOptions o = parse({"--only", "perf", "--perf-steps", "5", "--perf-batch", "2", "--perf-seq", "512"});
  CHECK((!o.kernels && !o.tiny && o.perf));
  CHECK(o.perf_steps == 5);
  CHECK(o.perf_model.batch == 2);
  CHECK(o.perf_model.seq == 512);
  CHECK_THROWS_WITH(parse({"--only", "all"}), Catch::Contains("--only 'all'"));
  CHECK_THROWS_WITH(parse({"--perf-steps", "0"}), Catch::Contains("must be an integer in [1, 10000]"));
  CHECK_THROWS_WITH(parse({"--perf-steps", "3x"}), Catch::Contains("'3x'"));
  CHECK_THROWS_WITH(parse({"--perf-batch"}), Catch::Contains("needs a value"));
  CHECK_THROWS_WITH(parse({"--frobnicate"}), Catch::Contains("unknown argument '--frobnicate'"));
  CHECK(parse({"--help"}).help);
}

TEST_CASE("check: every kernel of the fp32 twin matches the fp64 twin, and a tight bound fails", "[check]") {
  auto f32 = make_cpu_backend("fp32");
  auto f64 = make_cpu_backend("fp64");
  const std::vector<KernelResult> r = compare_kernels(*f32, *f64, kernel_bound(f32->precision()));
  REQUIRE(r.size() == 51);   // 22 cases (docs/gpu.md)
  int inexact = 0;
  for (const KernelResult& k : r) {
    INFO(k.name << " rel " << k.rel);
    CHECK(k.pass());
    inexact += k.rel > 0;   // fp32 is not fp64 (copies such as the embedding lookup are exact)
  }
  CHECK(inexact >= 20);
  // Negative: 1e-12 is below fp32's rounding, so every inexact output fails.
  for (const KernelResult& k : compare_kernels(*f32, *f64, 1e-12)) {
    INFO(k.name);
    if (k.rel > 0) CHECK_FALSE(k.pass());
  }
  // A backend against itself: zero error (deterministic kernels, same inputs).
  for (const KernelResult& k : compare_kernels(*f32, *f32, 0.0)) CHECK(k.pass());
}

TEST_CASE("check: the stated bounds", "[check]") {
  CHECK(kernel_bound(Precision::cuda("bf16", "fp32", "fp32")) == 2e-2);
  CHECK(kernel_bound(Precision::cuda("fp32", "fp32", "fp32")) == 1e-4);
}
