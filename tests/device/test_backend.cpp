// Backend selection and mixed-precision bookkeeping (no GPU needed).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <vector>

#include "meshrun/device/backend.hpp"
#include "meshrun/device/bf16.hpp"

using namespace meshrun::device;

TEST_CASE("precision: the CUDA backend follows param/grad/optim dtypes", "[precision]") {
  const Precision p = Precision::cuda("bf16", "fp32", "fp32");
  CHECK(p.param == DType::bf16);
  CHECK(p.grad == DType::f32);
  CHECK(p.optim == DType::f32);
  CHECK(p.stat == DType::f32);
  CHECK(p.has_master());
  CHECK_FALSE(Precision::cuda("fp32", "fp32", "fp32").has_master());
  CHECK_THROWS_WITH(Precision::cuda("fp16", "fp32", "fp32"), Catch::Contains("training.param_dtype='fp16'"));
  CHECK_THROWS_WITH(Precision::cuda("fp8", "fp32", "fp32"), Catch::Contains("use bf16"));
  CHECK_THROWS_WITH(Precision::cuda("bf16", "bf16", "fp32"), Catch::Contains("training.grad_dtype='bf16'"));
  CHECK_THROWS_WITH(Precision::cuda("bf16", "fp32", "bf16"), Catch::Contains("training.optim_dtype='bf16'"));
}

TEST_CASE("precision: the CPU backend computes everything in training.dtype", "[precision]") {
  for (auto [name, t] : {std::pair<const char*, DType>{"fp32", DType::f32}, {"fp64", DType::f64}}) {
    const Precision p = Precision::cpu(name);
    CHECK((p.param == t && p.grad == t && p.optim == t && p.stat == t));
    CHECK_FALSE(p.has_master());
    CHECK(make_cpu_backend(name)->precision().param == t);
  }
  CHECK_THROWS_WITH(Precision::cpu("bf16"), Catch::Contains("fp32 or fp64"));
  CHECK_THROWS(make_cpu_backend("fp16"));
}

TEST_CASE("device: MESHRUN_CUDA_DEVICE picks the task's device among the visible ones", "[device]") {
  ::unsetenv("MESHRUN_CUDA_DEVICE");
  CHECK(task_cuda_device(1) == 0);
  ::setenv("MESHRUN_CUDA_DEVICE", "3", 1);
  CHECK(task_cuda_device(4) == 3);
  CHECK_THROWS_WITH(task_cuda_device(3), Catch::Contains("MESHRUN_CUDA_DEVICE='3' is not a device index below 3"));
  ::setenv("MESHRUN_CUDA_DEVICE", "1x", 1);
  CHECK_THROWS(task_cuda_device(4));
  ::setenv("MESHRUN_CUDA_DEVICE", "-1", 1);
  CHECK_THROWS(task_cuda_device(4));
  ::unsetenv("MESHRUN_CUDA_DEVICE");
}

TEST_CASE("device: without a visible device the CUDA backend is refused with a reason", "[device]") {
  // This machine has no GPU (CUDA builds: the runtime says so; other builds: no backend compiled).
  std::string why;
  REQUIRE(cuda_device_count(&why) == 0);
  CHECK_FALSE(why.empty());
  if (!cuda_compiled()) CHECK_THROWS_WITH(make_cuda_backend(Precision::cuda("bf16", "fp32", "fp32"), 0),
                                          Catch::Contains("-DMESHRUN_CUDA=ON"));
}

TEST_CASE("cpu backend: the mixed AdamW bookkeeping is plain AdamW on the master copy", "[precision]") {
  // With param == master (CPU) the multi-tensor call is the reference adamw_update, bit for bit, per shard.
  auto be = make_cpu_backend("fp32");
  const std::int64_t n = 37;
  std::vector<float> p(n), m(n, 0.01f), v(n, 1e-4f), g(n);
  for (std::int64_t i = 0; i < n; ++i) {
    p[i] = 0.1f * static_cast<float>(i) - 1.0f;
    g[i] = 0.01f * static_cast<float>(i % 5) - 0.02f;
  }
  std::vector<float> rp = p, rm = m, rv = v;
  const AdamW hp{1e-2, 0.9, 0.95, 1e-8, 0.1, 2, 0.5};
  meshrun::kernels::cpu::adamw_update(rp.data(), rm.data(), rv.data(), g.data(), n, hp);

  Buf bp = be->alloc(n, DType::f32), bm = be->alloc(n, DType::f32), bv = be->alloc(n, DType::f32),
      bg = be->alloc(n, DType::f32);
  be->upload(bp, p.data());
  be->upload(bm, m.data());
  be->upload(bv, v.data());
  be->upload(bg, g.data());
  const AdamTensor ts[2] = {{bp.at(0, 20), bm.at(0, 20), bv.at(0, 20), bg.at(0, 20), bp.at(0, 20)},
                            {bp.at(20, n - 20), bm.at(20, n - 20), bv.at(20, n - 20), bg.at(20, n - 20), bp.at(20, n - 20)}};
  be->adamw(ts, hp);
  std::vector<double> out(n);
  be->download(out.data(), bp);
  for (std::int64_t i = 0; i < n; ++i) REQUIRE(out[i] == static_cast<double>(rp[i]));
  for (Buf* b : {&bp, &bm, &bv, &bg}) be->release(*b);
}

TEST_CASE("cpu backend: a buffer of another type is refused", "[backend]") {
  auto be = make_cpu_backend("fp32");
  CHECK_THROWS_WITH(be->alloc(4, DType::bf16), Catch::Contains("no bf16 buffers"));
  Buf x = be->alloc(4, DType::f32), i = be->alloc(4, DType::i32);
  CHECK_THROWS_WITH(be->add(x, i), Catch::Contains("expected fp32, got int32"));
  be->release(x);
  be->release(i);
}
