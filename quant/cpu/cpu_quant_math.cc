#include "quant/cpu/cpu_quant_math.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "quant/cpu/lapack_api.h"
#include "quant/kernels/gptq_math.h"

namespace qlink {
namespace quant {
namespace {

int Int(int64_t v) { return static_cast<int>(v); }

int64_t Col(const int32_t* perm, int64_t c) { return perm != nullptr ? perm[c] : c; }

class CpuQuantMath final : public QuantMath {
 public:
  CpuQuantMath(const LapackApi& api, LibraryReport report) : api_(api), report_(std::move(report)) {}

  const LibraryReport& libraries() const override { return report_; }

  // Each call runs at once on the calling thread: a lane is a thread of its own.
  // No more lanes than cores: threads beyond them only take turns.
  Status LaneStreams(int, size_t count, std::vector<Stream>* out) override {
    const size_t cores = std::max(1u, std::thread::hardware_concurrency());
    out->assign(std::min(count, cores), nullptr);
    return Status::Ok();
  }

  // Row-major C = A B is column-major C^T = B^T A^T: the operands swap, and C's rows are
  // the BLAS's columns, given in calls of kRowTile rows (quant_math.h): a BLAS may round a
  // column by where it falls in the call's panels, and a row's bits would then depend on
  // how many rows its device solves. With beta != 0 the product is rounded on its own
  // before it is added, as GPTQModel's W -= E @ U: a BLAS may accumulate the product into C
  // term by term (the reference BLAS does), and with -1 and 1 the two roundings then differ
  // from GPTQModel's on every library but OpenBLAS.
  Status Gemm(int, Stream, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
              int64_t ldb, float beta, float* c, int64_t ldc, bool) override {
    if (m == 0 || n == 0) return Status::Ok();
    const int mm = Int(n), kk = Int(k), la = Int(ldb), lb = Int(lda);
    const bool direct = beta == 0.0f;
    thread_local std::vector<float> product;  // one per virtual device's thread, kept
    if (!direct) product.resize(static_cast<size_t>(m * n));
    const float one = 1.0f, zero = 0.0f;
    {
      const SerialBlas serial(api_);
      for (int64_t r = 0; r < m; r += kRowTile) {
        const int nn = Int(std::min(kRowTile, m - r));
        const float* rows = a + r * lda;
        if (direct) {
          const int lc = Int(ldc);
          api_.sgemm("N", "N", &mm, &nn, &kk, &alpha, b, &la, rows, &lb, &beta, c + r * ldc, &lc, 1, 1);
        } else {
          api_.sgemm("N", "N", &mm, &nn, &kk, &one, b, &la, rows, &lb, &zero, product.data() + r * n, &mm, 1, 1);
        }
      }
    }
    if (direct) return Status::Ok();
    for (int64_t r = 0; r < m; ++r) {
      float* row = c + r * ldc;
      const float* p = product.data() + r * n;
      for (int64_t j = 0; j < n; ++j) row[j] = beta * row[j] + alpha * p[j];
    }
    return Status::Ok();
  }

  // x (rows x n, row-major) is x^T column-major: the lower triangle of h += (x^T)(x^T)^T.
  Status SyrkAccumulate(int, Stream, const float* x, int64_t rows, int64_t n, float* h) override {
    if (rows == 0) return Status::Ok();
    const int nn = Int(n), kk = Int(rows), ld = Int(n);
    const float one = 1.0f;
    const SerialBlas serial(api_);
    api_.ssyrk("L", "N", &nn, &kk, &one, x, &ld, &one, h, &ld, 1, 1);
    return Status::Ok();
  }

  Status Potrf(int, Stream, float* a, int64_t n, bool lower, bool* positive_definite) override {
    const int nn = Int(n);
    int info = 0;
    const SerialBlas serial(api_);
    api_.spotrf(lower ? "L" : "U", &nn, a, &nn, &info, 1);
    if (info < 0) return Internal("quant: spotrf refused argument " + std::to_string(-info));
    *positive_definite = info == 0;
    return Status::Ok();
  }

  Status CholeskyInverse(int device, Stream stream, const float* factor, float* inverse, int64_t n) override {
    std::memcpy(inverse, factor, sizeof(float) * n * n);
    const int nn = Int(n);
    int info = 0;
    const SerialBlas serial(api_);
    api_.spotri("L", &nn, inverse, &nn, &info, 1);
    if (info != 0) return RuntimeError("quant: spotri failed with info " + std::to_string(info));
    return MirrorTriangle(device, stream, inverse, n, /*lower_to_upper=*/true);
  }

  Status TriangularInverse(int, Stream, float* a, int64_t n, bool lower) override {
    const int nn = Int(n);
    int info = 0;
    const SerialBlas serial(api_);
    api_.strtri(lower ? "L" : "U", "N", &nn, a, &nn, &info, 1, 1);
    if (info != 0) return Internal("quant: strtri failed with info " + std::to_string(info));
    return Status::Ok();
  }

  // Column-major (i, j) is a[j * n + i]: lower_to_upper copies (i > j) onto (j, i).
  Status MirrorTriangle(int, Stream, float* a, int64_t n, bool lower_to_upper) override {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = j + 1; i < n; ++i) {
        if (lower_to_upper) {
          a[i * n + j] = a[j * n + i];
        } else {
          a[j * n + i] = a[i * n + j];
        }
      }
    }
    return Status::Ok();
  }

  Status Diagonal(int, Stream, const float* h, int64_t n, float* out) override {
    for (int64_t i = 0; i < n; ++i) out[i] = h[i * n + i];
    return Status::Ok();
  }

  Status PrepareHessian(int, Stream, const float* h, int64_t n, const int32_t* perm, float diag_add,
                        float* out) override {
    for (int64_t j = 0; j < n; ++j) {  // out's row j is the column-major view's column j: H[:, p(j)]
      float* dst = out + j * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = h[Col(perm, i) * n + Col(perm, j)];
      if (dst[j] == 0.0f) dst[j] = 1.0f;
      dst[j] += diag_add;
    }
    return Status::Ok();
  }

  Status LoadWeight(int, Stream, const void* w, DLDataType dtype, int64_t rows, int64_t cols, const int32_t* perm,
                    float* out) override {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c)
        out[r * cols + c] = LoadElement(w, dtype.code, dtype.bits, r * cols + Col(perm, c));
    }
    return Status::Ok();
  }

  Status StoreWeight(int, Stream, const float* w, int64_t rows, int64_t cols, const int32_t* position, DLDataType dtype,
                     void* out) override {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c)
        StoreElement(out, dtype.code, dtype.bits, r * cols + c, w[r * cols + Col(position, c)]);
    }
    return Status::Ok();
  }

  Status StoreCodes(int, Stream, const uint8_t* codes, int64_t rows, int64_t cols, const int32_t* position,
                    uint8_t* out) override {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = codes[r * cols + Col(position, c)];
    }
    return Status::Ok();
  }

  Status ZeroColumns(int, Stream, float* w, int64_t rows, int64_t ld, const int32_t* columns, int64_t count) override {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < count; ++i) w[r * ld + columns[i]] = 0.0f;
    }
    return Status::Ok();
  }

  Status GroupRanges(int, Stream, const float* w, int64_t rows, int64_t ld, int64_t group_size, int64_t first_group,
                     int64_t num_groups, const int32_t* columns, Grid grid, float* scales, float* zeros,
                     int64_t groups) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = w + r * ld;
      for (int64_t g = first_group; g < first_group + num_groups; ++g) {
        float lo = std::numeric_limits<float>::infinity(), hi = -lo;
        for (int64_t j = 0; j < group_size; ++j) {
          const int64_t c = g * group_size + j;
          const float v = row[columns != nullptr ? columns[c] : c];
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
        RangeToParams(lo, hi, grid.maxq(), grid.sym, &scales[r * groups + g], &zeros[r * groups + g]);
      }
    }
    return Status::Ok();
  }

  Status QuantizeBlock(int, Stream, const BlockArgs& a) override {
    const int maxq = a.grid.maxq();
    std::vector<float> w(static_cast<size_t>(a.count));
    for (int64_t r = 0; r < a.rows; ++r) {
      float* row = a.w + r * a.ld + a.first;
      std::memcpy(w.data(), row, sizeof(float) * a.count);
      double loss = 0;
      for (int64_t i = 0; i < a.count; ++i) {
        const int64_t c = a.first + i;
        const float* u = a.u + c * a.n + a.first;  // row c of U, from the block's first column
        const float d = u[i];
        const int64_t g = a.column_group[c];
        uint8_t level = 0;
        const float x = w[i];
        const float q = QuantizeValue(x, a.scales[r * a.groups + g], a.zeros[r * a.groups + g], maxq, &level);
        const float err = (x - q) / d;
        loss += static_cast<double>(err) * err;  // (w - q)^2 / d^2
        for (int64_t j = i; j < a.count; ++j) w[j] = Sub(w[j], Mul(err, u[j]));
        w[i] = q;
        a.err[r * a.count + i] = err;
        if (a.codes != nullptr) a.codes[r * a.ld + c] = level;
      }
      std::memcpy(row, w.data(), sizeof(float) * a.count);
      a.row_loss[r] += loss;
    }
    return Status::Ok();
  }

  Status Reverse(int, Stream, const float* in, float* out, int64_t count) override {
    std::reverse_copy(in, in + count, out);
    return Status::Ok();
  }

  Status ToFloat(int, Stream, const void* x, DLDataType dtype, int64_t count, float* out) override {
    for (int64_t i = 0; i < count; ++i) out[i] = LoadElement(x, dtype.code, dtype.bits, i);
    return Status::Ok();
  }

 private:
  const LapackApi& api_;
  const LibraryReport report_;
};

}  // namespace

Status MakeCpuQuantMath(const Libraries& libraries, std::unique_ptr<QuantMath>* out) {
  const LapackApi* api = nullptr;
  LibraryReport report;
  QLINK_RETURN_IF_ERROR(LoadLapack(libraries, &api, &report));
  *out = std::make_unique<CpuQuantMath>(*api, std::move(report));
  return Status::Ok();
}

}  // namespace quant
}  // namespace qlink
