// The GPTQ engine's per-vendor part: the linear algebra it takes from the vendor's
// libraries (BLAS GEMM and SYRK, LAPACK-style Cholesky) and the few kernels where fusion is
// the point. Each backend that can run the engine implements it (the CPU backend over
// BLAS/LAPACK, the GPU backend over cuBLAS/cuSOLVER or hipBLAS/hipSOLVER and
// quant/kernels); the algorithm itself (quant/gptq/) is written once against it.
//
// Conventions: matrices are row-major fp32 in `device`'s memory; every call enqueues on
// `stream` of `device` (making it current) and returns without waiting, except where it
// says it blocks. A "grid" is the integer range a weight is quantized to.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <dlpack/dlpack.h>

#include "backends/status.h"

namespace qlink {
namespace quant {

using Stream = void*;

// Which libraries to load, by file name or path; "" = the backend's default.
struct Libraries {
  std::string blas;
  std::string solver;
};

// What the libraries resolved to, for the log: which implementation, from which files,
// and a warning when that choice costs the user (the CPU engine on the reference BLAS).
struct LibraryReport {
  std::string loaded;   // e.g. "OpenBLAS 0.3.21 ... (BLAS /usr/lib/..., LAPACK /usr/lib/...)"
  std::string warning;  // "" when there is nothing to warn about
};

// The quantization grid of GPTQModel's Quantizer: levels 0..maxq; symmetric ranges put
// the zero point at (maxq + 1) / 2.
struct Grid {
  int bits = 4;
  bool sym = true;
  int maxq() const { return (1 << bits) - 1; }
};

// GPTQ's column loop over one block of columns [first, first + count) of w (rows x ld).
struct BlockArgs {
  float* w = nullptr;  // the working weight; the block's columns end as the
                       // dequantized values
  int64_t rows = 0, ld = 0;
  int64_t first = 0, count = 0;  // count <= kBlockColumns
  const float* u = nullptr;      // the upper Cholesky factor of H^-1 (n x n, ld n)
  int64_t n = 0;
  const int32_t* column_group = nullptr;  // per working column: its group in the tables
  const float* scales = nullptr;          // rows x groups
  const float* zeros = nullptr;
  int64_t groups = 0;
  Grid grid;
  uint8_t* codes = nullptr;    // optional: rows x ld, each working column's level
  float* err = nullptr;        // rows x count: each column's scaled error, for the
                               // cross-block update
  double* row_loss = nullptr;  // rows: each row's sum of err^2 = ((w - q) / d)^2 added
};

constexpr int64_t kBlockColumns = 128;  // GPTQ's lazy batch (blocksize)

// The engine splits a layer's rows over devices only at multiples of kRowTile, so a math
// whose library may round a row by the product's row count (OpenBLAS's Haswell and Zen
// kernels do) can issue each product in calls of kRowTile rows from the first: a row then
// takes part in the same calls in every world (the CPU's Gemm). A multiple of the row
// panels BLAS kernels walk (12, 16, 24, 32): on the kernels measured the calls round as
// one whole call does (docs/TESTING.md).
constexpr int64_t kRowTile = 96;

class QuantMath {
 public:
  virtual ~QuantMath() = default;

  // The libraries this math runs on (fixed once made).
  virtual const LibraryReport& libraries() const = 0;

  // Up to `count` streams of `device` the engine may run one call's independent solves on
  // at once, from a thread each (a small layer's kernels leave most of a GPU idle, a small
  // layer's BLAS calls most of a CPU's cores), the math's own, each with library handles of
  // its own, kept for the math's life; on the CPU null (every call runs at once on its
  // thread). None (the default) where every call must run on the caller's stream.
  virtual Status LaneStreams(int /*device*/, size_t /*count*/, std::vector<Stream>* out) {
    out->clear();
    return Status::Ok();
  }

  // ---- from the vendor's libraries ----
  // c (m x n, ldc) = alpha * a (m x k, lda) * b (k x n, ldb) + beta * c. tf32 allows the
  // vendor's TF32 tensor-core path; otherwise IEEE fp32.
  virtual Status Gemm(int device, Stream stream, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool tf32) = 0;
  // h (n x n) += x^T x for x (rows x n): a symmetric rank-k update of one triangle of h,
  // left for the caller to mirror (MirrorTriangle(lower_to_upper = true)).
  virtual Status SyrkAccumulate(int device, Stream stream, const float* x, int64_t rows, int64_t n, float* h) = 0;
  // The same for x of bf16 or fp16 read as it is by the vendor's tensor cores (exact
  // products, fp32 sums and output; on CUDA the sums leave the tensor cores every 32 rows
  // for IEEE fp32 adds, unless vendor_gemm asks for the vendor's GemmEx, whose sums stay in
  // them for the call's rows). Only where HasTensorSyrk(); callers elsewhere take the IEEE
  // path (ToFloat, SyrkAccumulate), which is also what the tensor path would give on
  // hardware summing in IEEE fp32.
  virtual bool HasTensorSyrk() const { return false; }
  virtual Status TensorSyrkAccumulate(int /*device*/, Stream, const void* /*x*/, DLDataType, int64_t /*rows*/,
                                      int64_t /*n*/, float* /*h*/, bool /*vendor_gemm*/) {
    return Internal("quant: this backend has no tensor-core rank-k update");
  }
  // LAPACK's potrf on the column-major n x n matrix a (symmetric: only the `lower` or
  // upper triangle is read and written), as PyTorch's linalg.cholesky calls it. Blocks
  // until it knows whether a is positive definite (*positive_definite false: the triangle
  // is garbage, the caller rebuilds a).
  virtual Status Potrf(int device, Stream stream, float* a, int64_t n, bool lower, bool* positive_definite) = 0;
  // The whole inverse (column-major, n x n, into `inverse`) of the matrix whose lower
  // Cholesky factor is the column-major lower triangle of `factor`, computed as PyTorch's
  // cholesky_inverse does on this kind of device: LAPACK potri, made symmetric (CPU);
  // potrs against the identity (cuSOLVER). Matching it call for call keeps the engine's
  // results with GPTQModel's to the last rounding wherever the libraries allow.
  virtual Status CholeskyInverse(int device, Stream stream, const float* factor, float* inverse, int64_t n) = 0;
  // LAPACK's trtri on the column-major n x n matrix a: its `lower` (or upper) triangle, a
  // triangular factor with a nonzero diagonal (a successful Potrf's), replaced by the
  // factor's inverse; the other triangle is left as it was.
  virtual Status TriangularInverse(int device, Stream stream, float* a, int64_t n, bool lower) = 0;
  // Copies the column-major lower triangle of a (n x n) over the upper one, or the
  // upper over the lower, making a symmetric.
  virtual Status MirrorTriangle(int device, Stream stream, float* a, int64_t n, bool lower_to_upper) = 0;

  // ---- kernels ----
  // out[i] = h[i][i].
  virtual Status Diagonal(int device, Stream stream, const float* h, int64_t n, float* out) = 0;
  // out = H[p][:, p] (p = perm, or the identity when NULL) in column-major order, as
  // PyTorch hands a matrix to LAPACK: out[j * n + i] = h[p(i) * n + p(j)]. A zero diagonal
  // entry (a dead column) becomes 1; then diag_add is added to the diagonal.
  virtual Status PrepareHessian(int device, Stream stream, const float* h, int64_t n, const int32_t* perm,
                                float diag_add, float* out) = 0;
  // out[r][c] = float(w[r][p(c)]) for w (rows x cols) of dtype fp32, bf16 or fp16.
  virtual Status LoadWeight(int device, Stream stream, const void* w, DLDataType dtype, int64_t rows, int64_t cols,
                            const int32_t* perm, float* out) = 0;
  // out[r][c] = w[r][q(c)] in `dtype` (fp32, bf16 or fp16, rounded to nearest even), q
  // the inverse of LoadWeight's p: gathered, so the writes stay in order.
  virtual Status StoreWeight(int device, Stream stream, const float* w, int64_t rows, int64_t cols,
                             const int32_t* position, DLDataType dtype, void* out) = 0;
  // out[r][c] = codes[r][q(c)] (rows x cols), q as for StoreWeight.
  virtual Status StoreCodes(int device, Stream stream, const uint8_t* codes, int64_t rows, int64_t cols,
                            const int32_t* position, uint8_t* out) = 0;
  // w[r][c] = 0 for the `count` listed columns.
  virtual Status ZeroColumns(int device, Stream stream, float* w, int64_t rows, int64_t ld, const int32_t* columns,
                             int64_t count) = 0;
  // Min-max scale and zero (GPTQModel's Quantizer.find_params) of groups first_group ..
  // first_group + num_groups - 1 of w (rows x ld): group g spans columns
  // columns[g * group_size + j] (or g * group_size + j when columns is NULL),
  // j < group_size; written to column g of scales and zeros (rows x groups).
  virtual Status GroupRanges(int device, Stream stream, const float* w, int64_t rows, int64_t ld, int64_t group_size,
                             int64_t first_group, int64_t num_groups, const int32_t* columns, Grid grid, float* scales,
                             float* zeros, int64_t groups) = 0;
  // The fused column loop of one block (BlockArgs).
  virtual Status QuantizeBlock(int device, Stream stream, const BlockArgs& args) = 0;
  // out[i] = in[count - 1 - i] (in and out do not overlap). For a column-major n x n X
  // (count n^2) out is J X J, J the exchange matrix: rows and columns in reverse order.
  virtual Status Reverse(int device, Stream stream, const float* in, float* out, int64_t count) = 0;
  // out = float(x) for `count` elements of dtype fp32, bf16 or fp16.
  virtual Status ToFloat(int device, Stream stream, const void* x, DLDataType dtype, int64_t count, float* out) = 0;
};

}  // namespace quant
}  // namespace qlink
