// The CUDA emulator's self-tests (docs/gpu.md, "The emulator"): each detection the emulator promises fires on
// a kernel or call written to break that rule, with the emulator's message, and the correct twin passes.
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels_test.hpp"
#include "meshrun/cuda_emu/emu.hpp"

namespace emu = meshrun::emu;

namespace {

// Each case starts with no error (a real context would need a new process after a sticky one).
struct Fresh {
  Fresh() {
    emu::reset_errors();
    (void)cudaGetLastError();
    emu::set_order_check(true);
  }
  ~Fresh() { emu::set_order_check(false); }
};

float* device_floats(const std::vector<float>& host) {
  float* p = nullptr;
  REQUIRE(cudaMalloc(&p, host.size() * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemcpy(p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  return p;
}
std::vector<float> host_floats(const float* p, std::size_t n) {
  std::vector<float> h(n);
  REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}
std::vector<float> iota(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i + 1);
  return v;
}

// The error the emulator reports after the failing call: the code, and its message naming the problem.
void expect_error(cudaError_t code, const std::string& words) {
  const cudaError_t e = cudaDeviceSynchronize() != cudaSuccess ? cudaPeekAtLastError() : cudaGetLastError();
  CHECK(std::string(cudaGetErrorName(e)) == cudaGetErrorName(code));
  CHECK_THAT(emu::last_error_message() + " | " + cudaGetErrorString(code), Catch::Contains(words));
}
void expect_ok() {
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(emu::last_error_message().empty());
}

// Runs `child` in a forked process; its exit status (or signal) and what it wrote on stderr.
struct Died {
  bool signaled = false;
  int sig = 0, status = 0;
  std::string err;
};
template <class F>
Died in_child(F child) {
  int fd[2];
  REQUIRE(pipe(fd) == 0);
  std::fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fd[1], 2);
    close(fd[0]);
    child();
    _exit(0);
  }
  close(fd[1]);
  Died d;
  char buf[4096];
  for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) > 0;) d.err.append(buf, static_cast<std::size_t>(n));
  close(fd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  d.signaled = WIFSIGNALED(st);
  d.sig = d.signaled ? WTERMSIG(st) : 0;
  d.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return d;
}

}  // namespace

TEST_CASE("emulator: a missing __syncthreads is reported naming the kernel; with the barrier it passes", "[emulator]") {
  Fresh f;
  float* in = device_floats(iota(64));
  float* out = device_floats(std::vector<float>(64, 0));
  emutest::reverse(out, in, true, nullptr);
  expect_ok();
  const std::vector<float> r = host_floats(out, 64);
  CHECK(r[0] == 64);
  CHECK(r[63] == 1);
  emutest::reverse(out, in, false, nullptr);
  expect_error(cudaErrorLaunchFailure, "kernel k_reverse wrote different bytes when its blocks and threads ran in");
  emu::reset_errors();
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("emulator: wrong shuffle masks are reported; the full mask over the whole warp passes", "[emulator]") {
  Fresh f;
  float* in = device_floats(iota(32));
  float* out = device_floats(std::vector<float>(1, 0));
  emutest::warp_sum(out, in, 0xffffffffu, true, nullptr);
  expect_ok();
  CHECK(host_floats(out, 1)[0] == 32 * 33 / 2);
  SECTION("the mask names lanes that exited before the shuffle") {
    emutest::warp_sum(out, in, 0xffffffffu, false, nullptr);
    expect_error(cudaErrorLaunchFailure, "names lane 16, which has exited");
  }
  SECTION("a lane reads a lane outside the mask") {
    emutest::warp_sum(out, in, 0x0000ffffu, false, nullptr);
    expect_error(cudaErrorLaunchFailure, "reads lane 16, which mask 0x0000ffff does not name");
  }
  SECTION("the mask does not name the calling lane") {
    emutest::warp_sum(out, in, 0xffff0000u, false, nullptr);
    expect_error(cudaErrorLaunchFailure, "does not name the calling lane 0");
  }
  emu::reset_errors();
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("emulator: a dynamic shared-memory index one past the end faults; the last index does not", "[emulator]") {
  Fresh f;
  float* out = device_floats(std::vector<float>(1, 0));
  emutest::shared_index(out, 32, 31, nullptr);
  expect_ok();
  CHECK(host_floats(out, 1)[0] == 31);
  emutest::shared_index(out, 32, 32, nullptr);
  expect_error(cudaErrorIllegalAddress, "kernel k_shared_index: block (0,0,0) thread (0,0,0): index past the end of its 128 bytes of dynamic shared memory");
  emu::reset_errors();
  cudaFree(out);
}

TEST_CASE("emulator: launches over the limits fail naming the kernel and the limit", "[emulator]") {
  Fresh f;
  float* p = device_floats(std::vector<float>(2048, 0));
  emutest::fill(p, 2048, 1, 1024, nullptr);
  expect_ok();
  emutest::fill(p, 2048, 1, 1025, nullptr);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK_THAT(std::string(cudaGetErrorString(cudaErrorInvalidConfiguration)),
             Catch::Contains("kernel k_fill: launch with block (1025,1,1) is over the limits"));
  CHECK(cudaGetLastError() == cudaSuccess);   // not sticky: the next launch runs
  emutest::fill_with_shared(p, 2048, 1, 48 * 1024, nullptr);
  expect_ok();
  emutest::fill_with_shared(p, 2048, 1, 48 * 1024 + 1, nullptr);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK_THAT(std::string(cudaGetErrorString(cudaErrorInvalidValue)),
             Catch::Contains("kernel k_fill: 49153 bytes of dynamic shared memory, over the 48 KiB limit"));
  cudaFree(p);
}

TEST_CASE("emulator: reading on one stream what another wrote needs an event wait", "[emulator]") {
  Fresh f;
  cudaStream_t a = nullptr, b = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  float* x = device_floats(std::vector<float>(1000, 0));
  float* y = device_floats(std::vector<float>(1000, 0));
  cudaEvent_t e = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  SECTION("with cudaEventRecord on the writer's stream and cudaStreamWaitEvent on the reader's") {
    emutest::fill(x, 1000, 7, 256, a);
    REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
    emutest::copy(y, x, 1000, b);
    expect_ok();
    CHECK(host_floats(y, 1000)[999] == 7);
  }
  SECTION("after the host synchronised with the writer's stream") {
    emutest::fill(x, 1000, 7, 256, a);
    REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
    emutest::copy(y, x, 1000, b);
    expect_ok();
  }
  SECTION("without the wait") {
    emutest::fill(x, 1000, 7, 256, a);
    emutest::copy(y, x, 1000, b);
    expect_error(cudaErrorLaunchFailure, "race: k_copy on stream");
    CHECK_THAT(emu::last_error_message(), Catch::Contains("which k_fill on stream"));
    CHECK_THAT(emu::last_error_message(), Catch::Contains("allocation #"));
  }
  SECTION("a write on one stream while another still reads, without a wait") {
    emutest::copy(y, x, 1000, a);
    emutest::fill(x, 1000, 3, 256, b);
    expect_error(cudaErrorLaunchFailure, "race: k_fill on stream");
    CHECK_THAT(emu::last_error_message(), Catch::Contains("which k_copy on stream"));
  }
  emu::reset_errors();
  cudaEventDestroy(e);
  cudaFree(x);
  cudaFree(y);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_CASE("emulator: out-of-bounds device memory accesses fault with the allocation named", "[emulator]") {
  Fresh f;
  SECTION("one past the end of a 256-byte multiple (the guard page)") {
    float* p = device_floats(std::vector<float>(1024, 0));
    emutest::fill(p, 1025, 1, 256, nullptr);
    expect_error(cudaErrorIllegalAddress, "k_fill wrote out of bounds: offset 4096 of allocation #");
    emu::reset_errors();
    cudaFree(p);
  }
  SECTION("into the slack after an odd size (the canary)") {
    float* p = device_floats(std::vector<float>(1000, 0));
    emutest::fill(p, 1001, 1, 256, nullptr);
    expect_error(cudaErrorIllegalAddress, "k_fill wrote out of bounds: offset 4000 of allocation #");
    emu::reset_errors();
    cudaFree(p);
  }
  SECTION("a freed allocation") {
    float* p = device_floats(std::vector<float>(64, 0));
    cudaFree(p);
    emutest::fill(p, 64, 1, 64, nullptr);
    expect_error(cudaErrorIllegalAddress, "after cudaFree");
    emu::reset_errors();
  }
}

TEST_CASE("emulator: a barrier that some threads skip is an error, not a hang", "[emulator]") {
  Fresh f;
  float* p = device_floats(std::vector<float>(1, 0));
  emutest::lonely_barrier(p, nullptr);
  expect_error(cudaErrorLaunchFailure, "__syncthreads in block (0,0,0) is reached by 1 of its 64 threads");
  emu::reset_errors();
  cudaFree(p);
}

TEST_CASE("emulator: host code reading device memory dies with the emulator's message", "[emulator]") {
  float* p = device_floats(iota(16));
  CHECK(host_floats(p, 16)[15] == 16);   // through cudaMemcpy: fine
  const Died d = in_child([&] {
    volatile float v = p[3];   // a host dereference of a device pointer
    (void)v;
  });
  CHECK(d.signaled);
  CHECK(d.sig == SIGABRT);
  CHECK_THAT(d.err, Catch::Contains("meshrun CUDA emulator: host code read device memory"));
  CHECK_THAT(d.err, Catch::Contains("offset 12) outside any CUDA call"));
  const Died w = in_child([&] { p[0] = 1; });
  CHECK(w.sig == SIGABRT);
  CHECK_THAT(w.err, Catch::Contains("host code wrote device memory"));
  cudaFree(p);
}

TEST_CASE("emulator: cudaMemcpy refuses ranges outside an allocation and mismatched kinds", "[emulator]") {
  Fresh f;
  float* p = device_floats(std::vector<float>(16, 0));
  std::vector<float> h(32);
  CHECK(cudaMemcpy(h.data(), p, 17 * sizeof(float), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK_THAT(std::string(cudaGetErrorString(cudaErrorInvalidValue)), Catch::Contains("is outside allocation #"));
  CHECK(cudaMemcpy(h.data(), p, 16 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK_THAT(std::string(cudaGetErrorString(cudaErrorInvalidValue)),
             Catch::Contains("the kind says host to device, the pointers are device to host"));
  (void)cudaGetLastError();
  cudaFree(p);
}

TEST_CASE("emulator: cuBLASLt outside the emulated subset fails naming the attribute", "[emulator]") {
  Fresh f;
  cublasLtHandle_t lt = nullptr;
  REQUIRE(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t op = nullptr;
  REQUIRE(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  REQUIRE(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 2, 3, 2) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, 3, 2, 3) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, 2, 2, 2) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t h{};
  int found = 0;
  REQUIRE(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 1, &h, &found) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(found == 1);
  // C = A·B, column-major: A = [1 3 5; 2 4 6], B = [1 0; 0 1; 1 1].
  float* da = device_floats({1, 2, 3, 4, 5, 6});
  float* db = device_floats({1, 0, 1, 0, 1, 1});
  float* dc = device_floats({0, 0, 0, 0});
  const float one = 1, zero = 0;
  REQUIRE(cublasLtMatmul(lt, op, &one, da, a, db, b, &zero, dc, c, dc, c, &h.algo, nullptr, 0, nullptr) ==
          CUBLAS_STATUS_SUCCESS);
  CHECK(host_floats(dc, 4) == std::vector<float>{6, 8, 8, 10});
  const std::int32_t row = CUBLASLT_ORDER_ROW;
  REQUIRE(cublasLtMatrixLayoutSetAttribute(a, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 1, &h, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(found == 0);
  CHECK_THAT(emu::cublaslt_last_message(), Catch::Contains("CUBLASLT_MATRIX_LAYOUT_ORDER of A"));
  const std::uint32_t bias = CUBLASLT_EPILOGUE_BIAS;
  REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &bias, sizeof bias) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatmul(lt, op, &one, da, a, db, b, &zero, dc, c, dc, c, nullptr, nullptr, 0, nullptr) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK_THAT(emu::cublaslt_last_message(), Catch::Contains("CUBLASLT_MATMUL_DESC_EPILOGUE"));
  // An algorithm chosen for 256-byte alignment refuses an operand that is only 4-byte aligned.
  const std::uint32_t col = CUBLASLT_ORDER_COL, dflt = CUBLASLT_EPILOGUE_DEFAULT;
  cublasLtMatrixLayoutSetAttribute(a, CUBLASLT_MATRIX_LAYOUT_ORDER, &col, sizeof col);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &dflt, sizeof dflt);
  REQUIRE(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 1, &h, &found) == CUBLAS_STATUS_SUCCESS);
  float* big = device_floats(std::vector<float>(8, 0));
  CHECK(cublasLtMatmul(lt, op, &one, big + 1, a, db, b, &zero, dc, c, dc, c, &h.algo, nullptr, 0, nullptr) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK_THAT(emu::cublaslt_last_message(), Catch::Contains("A (or one of its batches) is less aligned than the 256"));
  for (float* q : {da, db, dc, big}) cudaFree(q);
  cublasLtMatmulPreferenceDestroy(pref);
  for (auto l : {a, b, c}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
}

TEST_CASE("emulator: CUDA_VISIBLE_DEVICES and MESHRUN_EMULATED_DEVICES decide the devices, as the runtime reads them",
          "[emulator]") {
  auto count = [](const char* vis, const char* emulated) {
    std::string cmd = "env -u CUDA_VISIBLE_DEVICES -u MESHRUN_EMULATED_DEVICES";
    if (vis) cmd += std::string(" CUDA_VISIBLE_DEVICES='") + vis + "'";
    if (emulated) cmd += std::string(" MESHRUN_EMULATED_DEVICES=") + emulated;
    cmd += " " EMU_DEVICES_BIN " 2>/dev/null";
    FILE* f = popen(cmd.c_str(), "r");
    REQUIRE(f);
    char buf[128] = {};
    const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    pclose(f);
    return std::string(buf, n);
  };
  CHECK(count(nullptr, nullptr) == "8 cudaSuccess\n");
  CHECK(count(nullptr, "2") == "2 cudaSuccess\n");
  CHECK(count("3,1", nullptr) == "2 cudaSuccess\n");
  CHECK(count("1,9,2", nullptr) == "1 cudaSuccess\n");   // the list ends at the first invalid index
  CHECK(count("2", "2") == "0 cudaErrorNoDevice\n");
  CHECK(count("", nullptr) == "0 cudaErrorNoDevice\n");
  CHECK(count("-1", nullptr) == "0 cudaErrorNoDevice\n");
}
