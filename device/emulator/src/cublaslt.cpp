// The emulated cuBLASLt (docs/gpu.md, "The emulator"): descriptors, layouts, preferences and the heuristic as
// NVIDIA documents them, for the subset meshrun uses; the product is a reference GEMM with fp32 accumulation
// (k ascending, no contraction), run as an operation on the caller's stream. A combination outside the subset
// fails the way the library fails it (a status; the heuristic finds no algorithm), and the message names the
// attribute. What the real library would pick (tile shapes, split-k, its summation order) is not emulated.
#include <cublasLt.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "internal.hpp"
#include "meshrun/cuda_emu/emu.hpp"

struct cublasLtContext {
  int device = 0;
};
struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  std::int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  std::uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  std::int32_t pointer_mode = 0;   // CUBLASLT_POINTER_MODE_HOST
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type;
  std::uint64_t rows, cols;
  std::int64_t ld;
  std::int32_t order = CUBLASLT_ORDER_COL;
  std::int32_t batch = 1;
  std::int64_t stride = 0;
};
struct cublasLtMatmulPreferenceOpaque_t {
  std::uint64_t max_workspace = 0;
  std::uint32_t align[4] = {256, 256, 256, 256};   // A, B, C, D: what the caller promises (the library's default)
};

namespace meshrun::emu {
namespace {

thread_local std::string lt_message;

cublasStatus_t fail(cublasStatus_t s, const std::string& message) {
  lt_message = message;
  std::fprintf(stderr, "meshrun CUDA emulator: cuBLASLt: %s\n", message.c_str());
  return s;
}

// The algorithm the emulated heuristic returns: the alignments it was chosen for, checked by cublasLtMatmul.
struct Algo {
  std::uint64_t magic;
  std::uint32_t align[4];
};
constexpr std::uint64_t kAlgoMagic = 0x6d657368656d7531ull;

std::size_t type_size(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : t == CUDA_R_32F ? 4 : 0; }
const char* type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_64F: return "CUDA_R_64F";
    default: return "another type";
  }
}

float from_bf16(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint16_t to_bf16(float f) {   // round to nearest even; NaN stays NaN
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
float load(const char* p, cudaDataType_t t, std::int64_t i) {
  if (t == CUDA_R_16BF) {
    std::uint16_t h;
    std::memcpy(&h, p + i * 2, 2);
    return from_bf16(h);
  }
  float f;
  std::memcpy(&f, p + i * 4, 4);
  return f;
}
void store(char* p, cudaDataType_t t, std::int64_t i, float v) {
  if (t == CUDA_R_16BF) {
    const std::uint16_t h = to_bf16(v);
    std::memcpy(p + i * 2, &h, 2);
  } else {
    std::memcpy(p + i * 4, &v, 4);
  }
}

template <class T>
cublasStatus_t set(T& field, const void* buf, std::size_t size, const char* attr) {
  if (!buf || size != sizeof(T))
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(attr) + ": a buffer of " + std::to_string(size) +
                                                 " bytes, the attribute takes " + std::to_string(sizeof(T)));
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

// Whether the subset covers this product; the message names the first attribute it does not.
cublasStatus_t supported(const cublasLtMatmulDescOpaque_t& op, const cublasLtMatrixLayoutOpaque_t& a,
                         const cublasLtMatrixLayoutOpaque_t& b, const cublasLtMatrixLayoutOpaque_t& c,
                         const cublasLtMatrixLayoutOpaque_t& d) {
  if (op.compute != CUBLAS_COMPUTE_32F)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: only CUBLAS_COMPUTE_32F is emulated");
  if (op.scale != CUDA_R_32F)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "CUBLASLT_MATMUL_DESC_SCALE_TYPE: only CUDA_R_32F is emulated");
  if (op.pointer_mode != 0)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "CUBLASLT_MATMUL_DESC_POINTER_MODE: only host alpha/beta are emulated");
  if (op.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "CUBLASLT_MATMUL_DESC_EPILOGUE " + std::to_string(op.epilogue) +
                                                 ": only CUBLASLT_EPILOGUE_DEFAULT is emulated");
  for (int t : {op.transa, op.transb})
    if (t != CUBLAS_OP_N && t != CUBLAS_OP_T)
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, "CUBLASLT_MATMUL_DESC_TRANSA/TRANSB: only CUBLAS_OP_N and CUBLAS_OP_T");
  const cublasLtMatrixLayoutOpaque_t* all[4] = {&a, &b, &c, &d};
  const char* names[4] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; ++i) {
    if (all[i]->order != CUBLASLT_ORDER_COL)
      return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  std::string("CUBLASLT_MATRIX_LAYOUT_ORDER of ") + names[i] + ": only CUBLASLT_ORDER_COL is emulated");
    if (all[i]->ld < static_cast<std::int64_t>(std::max<std::uint64_t>(all[i]->rows, 1)))
      return fail(CUBLAS_STATUS_INVALID_VALUE, std::string("CUBLASLT_MATRIX_LAYOUT_LD of ") + names[i] + " (" +
                                                   std::to_string(all[i]->ld) + ") is below its rows (" +
                                                   std::to_string(all[i]->rows) + ")");
    if (all[i]->batch < 1)
      return fail(CUBLAS_STATUS_INVALID_VALUE, std::string("CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT of ") + names[i]);
  }
  if (a.type != b.type || (a.type != CUDA_R_16BF && a.type != CUDA_R_32F))
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, std::string("CUBLASLT_MATRIX_LAYOUT_TYPE: A ") + type_name(a.type) +
                                                 " and B " + type_name(b.type) +
                                                 ": emulated are both CUDA_R_16BF or both CUDA_R_32F");
  if (c.type != d.type || (d.type != CUDA_R_16BF && d.type != CUDA_R_32F) ||
      (a.type == CUDA_R_32F && d.type != CUDA_R_32F))
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, std::string("CUBLASLT_MATRIX_LAYOUT_TYPE: C ") + type_name(c.type) +
                                                 " and D " + type_name(d.type) + " with A/B " + type_name(a.type) +
                                                 ": emulated are bf16 inputs to bf16 or fp32, fp32 to fp32");
  const std::uint64_t m = op.transa == CUBLAS_OP_N ? a.rows : a.cols, ka = op.transa == CUBLAS_OP_N ? a.cols : a.rows;
  const std::uint64_t kb = op.transb == CUBLAS_OP_N ? b.rows : b.cols, n = op.transb == CUBLAS_OP_N ? b.cols : b.rows;
  if (ka != kb || c.rows != m || c.cols != n || d.rows != m || d.cols != n)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "the layouts do not make a product: op(A) " + std::to_string(m) + "x" +
                                                 std::to_string(ka) + ", op(B) " + std::to_string(kb) + "x" +
                                                 std::to_string(n) + ", C " + std::to_string(c.rows) + "x" +
                                                 std::to_string(c.cols) + ", D " + std::to_string(d.rows) + "x" +
                                                 std::to_string(d.cols));
  if (a.batch != d.batch || b.batch != d.batch || c.batch != d.batch)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT differs between A, B, C and D");
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

std::string cublaslt_last_message() { return lt_message; }

}  // namespace meshrun::emu

using namespace meshrun::emu;

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: null handle");
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtCreate: no CUDA device");
  *handle = new cublasLtContext{dev};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (!handle) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: null handle");
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  if (!desc) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate: null descriptor");
  *desc = new cublasLtMatmulDescOpaque_t{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, std::size_t size) {
  if (!d) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute: null descriptor");
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return set(d->compute, buf, size, "CUBLASLT_MATMUL_DESC_COMPUTE_TYPE");
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return set(d->scale, buf, size, "CUBLASLT_MATMUL_DESC_SCALE_TYPE");
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return set(d->pointer_mode, buf, size, "CUBLASLT_MATMUL_DESC_POINTER_MODE");
    case CUBLASLT_MATMUL_DESC_TRANSA: return set(d->transa, buf, size, "CUBLASLT_MATMUL_DESC_TRANSA");
    case CUBLASLT_MATMUL_DESC_TRANSB: return set(d->transb, buf, size, "CUBLASLT_MATMUL_DESC_TRANSB");
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set(d->epilogue, buf, size, "CUBLASLT_MATMUL_DESC_EPILOGUE");
    default:
      return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "cublasLtMatmulDescSetAttribute: attribute " + std::to_string(int(attr)) + " is not emulated");
  }
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, std::uint64_t rows,
                                          std::uint64_t cols, std::int64_t ld) {
  if (!l) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: null layout");
  *l = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, std::size_t size) {
  if (!l) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutSetAttribute: null layout");
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return set(l->type, buf, size, "CUBLASLT_MATRIX_LAYOUT_TYPE");
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return set(l->order, buf, size, "CUBLASLT_MATRIX_LAYOUT_ORDER");
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return set(l->rows, buf, size, "CUBLASLT_MATRIX_LAYOUT_ROWS");
    case CUBLASLT_MATRIX_LAYOUT_COLS: return set(l->cols, buf, size, "CUBLASLT_MATRIX_LAYOUT_COLS");
    case CUBLASLT_MATRIX_LAYOUT_LD: return set(l->ld, buf, size, "CUBLASLT_MATRIX_LAYOUT_LD");
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set(l->batch, buf, size, "CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT");
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return set(l->stride, buf, size, "CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET");
  }
  return fail(CUBLAS_STATUS_NOT_SUPPORTED,
              "cublasLtMatrixLayoutSetAttribute: attribute " + std::to_string(int(attr)) + " is not emulated");
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  if (!p) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate: null preference");
  *p = new cublasLtMatmulPreferenceOpaque_t{};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    std::size_t size) {
  if (!p) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceSetAttribute: null preference");
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return set(p->max_workspace, buf, size, "CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return set(p->align[0], buf, size, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return set(p->align[1], buf, size, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return set(p->align[2], buf, size, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return set(p->align[3], buf, size, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES");
  }
  return fail(CUBLAS_STATUS_NOT_SUPPORTED,
              "cublasLtMatmulPreferenceSetAttribute: attribute " + std::to_string(int(attr)) + " is not emulated");
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* returned) {
  if (!handle) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtMatmulAlgoGetHeuristic: null handle");
  if (!op || !a || !b || !c || !d || !pref || requested < 1 || !results || !returned)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoGetHeuristic: a null descriptor or no room for results");
  *returned = 0;
  const cublasStatus_t s = supported(*op, *a, *b, *c, *d);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  for (int i = 0; i < 4; ++i)
    if (pref->align[i] == 0 || (pref->align[i] & (pref->align[i] - 1)))
      return fail(CUBLAS_STATUS_INVALID_VALUE, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES " +
                                                   std::to_string(pref->align[i]) + " is not a power of two");
  std::memset(&results[0], 0, sizeof results[0]);
  Algo algo{kAlgoMagic, {pref->align[0], pref->align[1], pref->align[2], pref->align[3]}};
  static_assert(sizeof(Algo) <= sizeof(cublasLtMatmulAlgo_t));
  std::memcpy(&results[0].algo, &algo, sizeof algo);
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t adesc, const void* B, cublasLtMatrixLayout_t bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t cdesc, void* D,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              std::size_t workspace_bytes, cudaStream_t stream) {
  (void)workspace;
  (void)workspace_bytes;
  if (!handle) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtMatmul: null handle");
  if (!op || !adesc || !bdesc || !cdesc || !ddesc || !alpha || !beta || !A || !B || !D)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: a null descriptor, scalar or matrix");
  cublasStatus_t s = supported(*op, *adesc, *bdesc, *cdesc, *ddesc);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  Algo al{kAlgoMagic, {256, 256, 256, 256}};
  if (algo) {
    std::memcpy(&al, algo, sizeof al);
    if (al.magic != kAlgoMagic)
      return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: the algorithm did not come from the heuristic");
  }
  const float fa = *static_cast<const float*>(alpha), fb = *static_cast<const float*>(beta);
  if (fb != 0 && !C) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: beta != 0 with a null C");
  if (C == D && (cdesc->ld != ddesc->ld || cdesc->type != ddesc->type || cdesc->stride != ddesc->stride))
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                "cublasLtMatmul in place (C == D) needs the same layout for C and D (ld, type, batch stride)");
  // The alignments the algorithm was chosen for must hold for every batch of every operand.
  const void* ptr[4] = {A, B, C ? C : D, D};
  const cublasLtMatrixLayoutOpaque_t* lay[4] = {adesc, bdesc, cdesc, ddesc};
  const char* names[4] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; ++i) {
    std::uint64_t addr = reinterpret_cast<std::uintptr_t>(ptr[i]);
    if (lay[i]->batch > 1) addr |= static_cast<std::uint64_t>(lay[i]->stride) * type_size(lay[i]->type);
    if (addr % al.align[i] != 0)
      return fail(CUBLAS_STATUS_INVALID_VALUE, std::string("cublasLtMatmul: ") + names[i] + " (or one of its batches) " +
                                                   "is less aligned than the " + std::to_string(al.align[i]) +
                                                   " bytes the algorithm was chosen for (CUBLASLT_MATMUL_PREF_MIN_"
                                                   "ALIGNMENT_" + names[i] + "_BYTES)");
  }
  const bool ta = op->transa == CUBLAS_OP_T, tb = op->transb == CUBLAS_OP_T;
  const std::int64_t m = static_cast<std::int64_t>(ddesc->rows), n = static_cast<std::int64_t>(ddesc->cols);
  const std::int64_t k = static_cast<std::int64_t>(ta ? adesc->rows : adesc->cols);
  const cudaDataType_t ab = adesc->type, dt = ddesc->type;
  const std::size_t es = type_size(ab), ds = type_size(dt);
  const bool ok = run_on_stream(stream, "cublasLtMatmul", [&] {
    std::vector<float> a(static_cast<std::size_t>(m * k)), bm(static_cast<std::size_t>(k * n)), acc(m);
    for (std::int32_t bi = 0; bi < ddesc->batch; ++bi) {
      const char* pa = static_cast<const char*>(A) + bi * adesc->stride * static_cast<std::int64_t>(es);
      const char* pb = static_cast<const char*>(B) + bi * bdesc->stride * static_cast<std::int64_t>(es);
      const char* pc = C ? static_cast<const char*>(C) + bi * cdesc->stride * static_cast<std::int64_t>(ds) : nullptr;
      char* pd = static_cast<char*>(D) + bi * ddesc->stride * static_cast<std::int64_t>(ds);
      for (std::int64_t p = 0; p < k; ++p)
        for (std::int64_t i = 0; i < m; ++i) a[i + p * m] = load(pa, ab, ta ? p + i * adesc->ld : i + p * adesc->ld);
      for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t p = 0; p < k; ++p) bm[p + j * k] = load(pb, ab, tb ? j + p * bdesc->ld : p + j * bdesc->ld);
      for (std::int64_t j = 0; j < n; ++j) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (std::int64_t p = 0; p < k; ++p) {
          const float bv = bm[p + j * k];
          const float* ap = a.data() + p * m;
          for (std::int64_t i = 0; i < m; ++i) acc[i] += ap[i] * bv;
        }
        for (std::int64_t i = 0; i < m; ++i) {
          float v = fa * acc[i];
          if (fb != 0) v += fb * load(pc, dt, i + j * cdesc->ld);   // beta == 0: C is not read (BLAS)
          store(pd, dt, i + j * ddesc->ld, v);
        }
      }
    }
  });
  if (!ok) return fail(CUBLAS_STATUS_EXECUTION_FAILED, "cublasLtMatmul: " + meshrun::emu::last_error_message());
  return CUBLAS_STATUS_SUCCESS;
}
