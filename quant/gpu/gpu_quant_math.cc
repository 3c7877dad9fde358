#include "quant/gpu/gpu_quant_math.h"

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/gpu/gpu_runtime.h"
#include "backends/gpu/gpu_status.h"
#include "backends/vendor_library.h"
#include "quant/gpu/linalg_api.h"
#include "quant/kernels/gptq_kernels.h"
#include "quant/kernels/hessian_kernels.h"

namespace qlink {
namespace quant {
namespace {

using ::qlink::gpu::Activate;
using ::qlink::gpu::Check;

// Errors of this layer read "quant: <the vendor's call> failed: <its status name> (<value>)".
Status CheckBlas(int result, const char* call) {
  if (result == 0) return Status::Ok();
  return RuntimeError(std::string("quant: ") + call + " failed: " + BlasStatusName(result) + " (" +
                      std::to_string(result) + ")");
}

Status CheckSolver(int result, const char* call) {
  if (result == 0) return Status::Ok();
  return RuntimeError(std::string("quant: ") + call + " failed: " + SolverStatusName(result) + " (" +
                      std::to_string(result) + ")");
}

int Int(int64_t v) { return static_cast<int>(v); }

gpuStream_t S(Stream s) { return static_cast<gpuStream_t>(s); }

// Library handles and solver scratch, used by one call at a time: a device's shared one
// for the callers' streams, and one per lane stream (LaneStreams), used on that stream only.
// The shared one's buffers are one set for every caller stream: a use on a stream waits for
// the last use on another (`used`, recorded after each), so two callers' streams never run
// its workspaces at once.
struct DeviceState {
  std::mutex mu;
  Stream last = nullptr;      // the stream of the shared state's last use
  gpuEvent_t used = nullptr;  // recorded on `last` after that use
  LinalgApi::Handle blas = nullptr, solver = nullptr;
  float* work = nullptr;  // solver workspace, grown on demand
  int work_floats = 0;
  std::vector<char> host_work;  // trtri's host workspace, grown on demand
  // The solver's device-side status: [0] potrf's, read after it; [1] potrs' and trtri's,
  // never read. Apart, so a potrs enqueued by an earlier call, still to run on its own
  // stream, cannot overwrite the status a later potrf on another stream is judged by.
  int* info = nullptr;
  // cuBLAS's workspace for this state's handle (null where the vendor takes none): handles
  // on several streams at once must not share the library's default pool (PyTorch gives
  // each handle and stream its own too).
  void* blas_work = nullptr;
};

// cuBLAS's recommended workspace on Hopper (4 MiB suffices on earlier GPUs).
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;
// TensorSyrkAccumulate's GemmEx triangle splits a half again only into halves this wide or
// wider: a 2048-column square of a 2048-row call still fills an H100's SMs with 128 x 128 tiles.
constexpr int64_t kTriangleLeaf = 2048;

class GpuQuantMath final : public QuantMath {
 public:
  GpuQuantMath(const LinalgApi& api, int devices)
      : api_(api),
        report_{"BLAS " + DefiningFile(reinterpret_cast<const void*>(api.Sgemm)) + ", solver " +
                    DefiningFile(reinterpret_cast<const void*>(api.Spotrf)),
                ""},
        states_(static_cast<size_t>(devices)),
        lanes_(static_cast<size_t>(devices)) {}
  ~GpuQuantMath() override {
    for (size_t d = 0; d < states_.size(); ++d) {
      if (gpuSetDevice(static_cast<int>(d)) != gpuSuccess) continue;
      Release(states_[d]);
      for (auto& lane : lanes_[d].lanes) {
        Release(lane->state);
        (void)gpuStreamDestroy(lane->stream);
      }
      // The handles are left to the process's end: destroying them here can run after the
      // driver has shut down (a backend lives as long as its context, maybe at exit).
    }
  }

  Status LaneStreams(int device, size_t count, std::vector<Stream>* out) override {
    if (device < 0 || static_cast<size_t>(device) >= lanes_.size())
      return Internal("quant: no device " + std::to_string(device));
    DeviceLanes& dl = lanes_[device];
    std::lock_guard<std::mutex> lock(dl.mu);
    if (dl.lanes.size() < count) QLINK_RETURN_IF_ERROR(Activate(device));
    while (dl.lanes.size() < count) {
      auto lane = std::make_unique<Lane>();
      QLINK_RETURN_IF_ERROR(Check(gpuStreamCreateWithFlags(&lane->stream, gpuStreamNonBlocking), "gpuStreamCreate"));
      dl.lanes.push_back(std::move(lane));
    }
    out->clear();
    for (size_t i = 0; i < count; ++i) out->push_back(dl.lanes[i]->stream);
    return Status::Ok();
  }

  const LibraryReport& libraries() const override { return report_; }

  Status Gemm(int device, Stream stream, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool tf32) override {
    if (m == 0 || n == 0) return Status::Ok();
    return WithState(device, stream, [&](DeviceState& st) -> Status {
      QLINK_RETURN_IF_ERROR(Blas(st, stream, tf32));
      // Row-major C = A B is column-major C^T = B^T A^T: the operands swap.
      return CheckBlas(api_.Sgemm(st.blas, api_.op_n, api_.op_n, Int(n), Int(m), Int(k), &alpha, b, Int(ldb), a,
                                  Int(lda), &beta, c, Int(ldc)),
                       api_.names.sgemm);
    });
  }

  // The lower triangle of h (column-major) += A A^T for A = x^T (n x rows, column-major),
  // as two half-size SYRKs on the diagonal and one GEMM below them: the same flops as one
  // SYRK, half of them in the vendor's faster GEMM (bench/RESULTS.md times it; split four
  // ways, the smaller GEMMs leave SMs idle).
  Status SyrkAccumulate(int device, Stream stream, const float* x, int64_t rows, int64_t n, float* h) override {
    if (rows == 0) return Status::Ok();
    return WithState(device, stream, [&](DeviceState& st) -> Status {
      QLINK_RETURN_IF_ERROR(Blas(st, stream, /*tf32=*/false));
      const float one = 1.0f;
      const int64_t p = n / 2, q = n - p;
      auto syrk = [&](int64_t first, int64_t size) {
        return CheckBlas(api_.Ssyrk(st.blas, api_.fill_lower, api_.op_n, Int(size), Int(rows), &one, x + first, Int(n),
                                    &one, h + first * n + first, Int(n)),
                         api_.names.ssyrk);
      };
      if (p == 0) return syrk(0, n);
      QLINK_RETURN_IF_ERROR(syrk(0, p));
      QLINK_RETURN_IF_ERROR(CheckBlas(api_.Sgemm(st.blas, api_.op_n, api_.op_t, Int(q), Int(p), Int(rows), &one, x + p,
                                                 Int(n), x, Int(n), &one, h + p, Int(n)),
                                      api_.names.sgemm));
      return syrk(p, q);
    });
  }

  bool HasTensorSyrk() const override { return api_.GemmEx != nullptr; }

  // As SyrkAccumulate with the 16-bit x read as it is by the tensor cores. On CUDA, qlink's
  // own kernel: every 32 rows' sum leaves the tensor cores for an IEEE fp32 add, where
  // GemmEx chains all of a call's rows in their truncating accumulators. Elsewhere, on
  // CUDA where vendor_gemm asks for it, and for x the kernel's 16-byte loads cannot take
  // (n % 8 != 0, x misaligned), GemmEx
  // (16-bit inputs, fp32 output and compute type): the vendors have no real 16-bit SYRK,
  // so the lower triangle is the GEMM below its diagonal halves and each half's own
  // triangle, split again while it keeps 2 * kTriangleLeaf columns (the work 3/4 of the full
  // product's below 8192 columns, 5/8 at 8192, 9/16 at 28672).
  Status TensorSyrkAccumulate(int device, Stream stream, const void* x, DLDataType dtype, int64_t rows, int64_t n,
                              float* h, bool vendor_gemm) override {
    if (rows == 0) return Status::Ok();
#if !defined(QLINK_GPU_HIP)
    if (!vendor_gemm && gpu::PromotedSyrkFits(x, n)) {
      QLINK_RETURN_IF_ERROR(Activate(device));
      return Check(gpu::LaunchPromotedSyrk(x, dtype, rows, n, h, S(stream)), "promoted-syrk kernel");
    }
#endif
    const int type = dtype.code == kDLBfloat ? api_.r_16bf : api_.r_16f;
    return WithState(device, stream, [&](DeviceState& st) -> Status {
      QLINK_RETURN_IF_ERROR(Blas(st, stream, /*tf32=*/false));
      const float one = 1.0f;
      const auto* x16 = static_cast<const uint16_t*>(x);
      // h[first_row.., first_col..] (count_rows x count_cols, column-major) += x[:, rows]^T x[:, cols].
      auto gemm = [&](int64_t first_row, int64_t count_rows, int64_t first_col, int64_t count_cols) {
        return CheckBlas(
            api_.GemmEx(st.blas, api_.op_n, api_.op_t, Int(count_rows), Int(count_cols), Int(rows), &one,
                        x16 + first_row, type, Int(n), x16 + first_col, type, Int(n), &one,
                        h + first_col * n + first_row, api_.r_32f, Int(n), api_.compute_32f, api_.gemm_default),
            api_.names.gemm_ex);
      };
      // h's lower triangle over columns [first, first + size): a half keeping 2 * kTriangleLeaf
      // columns is split again, a narrower one is a whole GEMM.
      std::function<Status(int64_t, int64_t)> triangle = [&](int64_t first, int64_t size) -> Status {
        const int64_t p = size / 2, q = size - p;
        if (p == 0) return gemm(first, size, first, size);
        auto half = [&](int64_t at, int64_t count) {
          return count >= 2 * kTriangleLeaf ? triangle(at, count) : gemm(at, count, at, count);
        };
        QLINK_RETURN_IF_ERROR(half(first, p));
        QLINK_RETURN_IF_ERROR(gemm(first + p, q, first, p));
        return half(first + p, q);
      };
      return triangle(0, n);
    });
  }

  Status Potrf(int device, Stream stream, float* a, int64_t n, bool lower, bool* positive_definite) override {
    return WithState(device, stream, [&](DeviceState& st) -> Status {
      const int uplo = lower ? api_.fill_lower : api_.fill_upper;
      int lwork = 0;
      QLINK_RETURN_IF_ERROR(Solver(st, stream));
      QLINK_RETURN_IF_ERROR(
          CheckSolver(api_.SpotrfBufferSize(st.solver, uplo, Int(n), a, Int(n), &lwork), api_.names.potrf_size));
      QLINK_RETURN_IF_ERROR(Work(st, lwork));
      QLINK_RETURN_IF_ERROR(
          CheckSolver(api_.Spotrf(st.solver, uplo, Int(n), a, Int(n), st.work, lwork, st.info), api_.names.potrf));
      int info = 0;
      QLINK_RETURN_IF_ERROR(ReadInfo(st, stream, &info));
      if (info < 0) return Internal("quant: potrf refused argument " + std::to_string(-info));
      *positive_definite = info == 0;
      return Status::Ok();
    });
  }

  // As PyTorch's cholesky_inverse on CUDA: potrs of the identity.
  Status CholeskyInverse(int device, Stream stream, const float* factor, float* inverse, int64_t n) override {
    return WithState(device, stream, [&](DeviceState& st) -> Status {
      QLINK_RETURN_IF_ERROR(Check(gpu::LaunchIdentity(inverse, n, S(stream)), "identity kernel"));
      QLINK_RETURN_IF_ERROR(Solver(st, stream));
      // potrs' info reports only an invalid argument, and every argument here is the engine's
      // own: not read (reading it would wait for the device at every inverse; ATen skips it too).
      return CheckSolver(
          api_.Spotrs(st.solver, api_.fill_lower, Int(n), Int(n), factor, Int(n), inverse, Int(n), st.info + 1),
          api_.names.potrs);
    });
  }

  // trtri's info reports only a zero diagonal, which the factor of a successful potrf
  // cannot have: not read (reading it would wait for the device).
  Status TriangularInverse(int device, Stream stream, float* a, int64_t n, bool lower) override {
    if (api_.Xtrtri == nullptr) {
      return Unavailable(std::string("quant: the solver library lacks ") + api_.names.trtri +
                         ", which the triangular inverse (qlink_gptq_options.inverse) needs");
    }
    return WithState(device, stream, [&](DeviceState& st) -> Status {
      const int uplo = lower ? api_.fill_lower : api_.fill_upper;
      size_t device_bytes = 0, host_bytes = 0;
      QLINK_RETURN_IF_ERROR(Solver(st, stream));
      QLINK_RETURN_IF_ERROR(CheckSolver(
          api_.XtrtriBufferSize(st.solver, uplo, api_.diag_non_unit, n, api_.r_32f, a, n, &device_bytes, &host_bytes),
          api_.names.trtri_size));
      QLINK_RETURN_IF_ERROR(Work(st, Int((device_bytes + sizeof(float) - 1) / sizeof(float))));
      QLINK_RETURN_IF_ERROR(HostWork(st, host_bytes));
      return CheckSolver(api_.Xtrtri(st.solver, uplo, api_.diag_non_unit, n, api_.r_32f, a, n, st.work,
                                     sizeof(float) * static_cast<size_t>(st.work_floats), st.host_work.data(),
                                     st.host_work.size(), st.info + 1),
                         api_.names.trtri);
    });
  }

  Status MirrorTriangle(int device, Stream stream, float* a, int64_t n, bool lower_to_upper) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchMirrorTriangle(a, n, lower_to_upper, S(stream)), "mirror kernel");
  }

  Status Reverse(int device, Stream stream, const float* in, float* out, int64_t count) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchReverse(in, out, count, S(stream)), "reverse kernel");
  }

  Status Diagonal(int device, Stream stream, const float* h, int64_t n, float* out) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchDiagonal(h, n, out, S(stream)), "diagonal kernel");
  }

  Status PrepareHessian(int device, Stream stream, const float* h, int64_t n, const int32_t* perm, float diag_add,
                        float* out) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchPrepareHessian(h, n, perm, diag_add, out, S(stream)), "prepare-hessian kernel");
  }

  Status LoadWeight(int device, Stream stream, const void* w, DLDataType dtype, int64_t rows, int64_t cols,
                    const int32_t* perm, float* out) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchLoadWeight(w, dtype, rows, cols, perm, out, S(stream)), "load-weight kernel");
  }

  Status StoreWeight(int device, Stream stream, const float* w, int64_t rows, int64_t cols, const int32_t* position,
                     DLDataType dtype, void* out) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchStoreWeight(w, rows, cols, position, dtype, out, S(stream)), "store-weight kernel");
  }

  Status StoreCodes(int device, Stream stream, const uint8_t* codes, int64_t rows, int64_t cols,
                    const int32_t* position, uint8_t* out) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchStoreCodes(codes, rows, cols, position, out, S(stream)), "store-codes kernel");
  }

  Status ZeroColumns(int device, Stream stream, float* w, int64_t rows, int64_t ld, const int32_t* columns,
                     int64_t count) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchZeroColumns(w, rows, ld, columns, count, S(stream)), "zero-columns kernel");
  }

  Status GroupRanges(int device, Stream stream, const float* w, int64_t rows, int64_t ld, int64_t group_size,
                     int64_t first_group, int64_t num_groups, const int32_t* columns, Grid grid, float* scales,
                     float* zeros, int64_t groups) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchGroupRanges(w, rows, ld, group_size, first_group, num_groups, columns, grid, scales, zeros,
                                        groups, S(stream)),
                 "group-ranges kernel");
  }

  Status QuantizeBlock(int device, Stream stream, const BlockArgs& args) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchQuantizeBlock(args, S(stream)), "quantize-block kernel");
  }

  Status ToFloat(int device, Stream stream, const void* x, DLDataType dtype, int64_t count, float* out) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchToFloat(x, dtype, count, out, S(stream)), "to-float kernel");
  }

 private:
  // A lane stream of a device and its own state.
  struct Lane {
    gpuStream_t stream = nullptr;
    DeviceState state;
  };
  struct DeviceLanes {
    std::mutex mu;
    std::vector<std::unique_ptr<Lane>> lanes;  // grown by LaneStreams, never shrunk
  };

  static void Release(DeviceState& st) {
    if (st.work != nullptr) (void)gpuFree(st.work);
    if (st.info != nullptr) (void)gpuFree(st.info);
    if (st.blas_work != nullptr) (void)gpuFree(st.blas_work);
    if (st.used != nullptr) (void)gpuEventDestroy(st.used);
  }

  // The state for work on `stream` of `device` (its lane's, or the device's shared one)
  // with its handles made, `device` current.
  Status Acquire(int device, Stream stream, DeviceState** out) {
    if (device < 0 || static_cast<size_t>(device) >= states_.size())
      return Internal("quant: no device " + std::to_string(device));
    QLINK_RETURN_IF_ERROR(Activate(device));
    DeviceState* state = &states_[device];
    {
      DeviceLanes& dl = lanes_[device];
      std::lock_guard<std::mutex> lock(dl.mu);
      for (auto& lane : dl.lanes) {
        if (lane->stream == S(stream)) state = &lane->state;
      }
    }
    DeviceState& st = *state;
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.blas == nullptr) {
      // All or none: a device left with a handle but no info buffer would fail every later
      // call for the life of the process.
      LinalgApi::Handle blas = nullptr, solver = nullptr;
      int* info = nullptr;
      void* blas_work = nullptr;
      Status s = CheckBlas(api_.BlasCreate(&blas), api_.names.blas_create);
      if (s.ok()) s = CheckSolver(api_.SolverCreate(&solver), api_.names.solver_create);
      if (s.ok()) s = Check(gpuMalloc(reinterpret_cast<void**>(&info), 2 * sizeof(int)), "gpuMalloc");
      if (s.ok() && api_.BlasSetWorkspace != nullptr)
        s = Check(gpuMalloc(&blas_work, kBlasWorkspaceBytes), "gpuMalloc");
      if (!s.ok()) {
        if (info != nullptr) (void)gpuFree(info);
        if (solver != nullptr) (void)api_.SolverDestroy(solver);
        if (blas != nullptr) (void)api_.BlasDestroy(blas);
        return s;
      }
      st.blas = blas;
      st.solver = solver;
      st.info = info;
      st.blas_work = blas_work;
    }
    *out = &st;
    return Status::Ok();
  }

  // body(state) for work on `stream` of `device`, the state held (Acquire), after the
  // shared state's last use on another stream.
  template <typename Body>
  Status WithState(int device, Stream stream, Body body) {
    DeviceState* st = nullptr;
    QLINK_RETURN_IF_ERROR(Acquire(device, stream, &st));
    std::lock_guard<std::mutex> lock(st->mu);
    if (st != &states_[device]) return body(*st);  // a lane's: used on its stream only
    if (st->used != nullptr && st->last != stream)
      QLINK_RETURN_IF_ERROR(Check(gpuStreamWaitEvent(S(stream), st->used, 0), "gpuStreamWaitEvent"));
    Status s = body(*st);
    Status recorded = Status::Ok();
    if (st->used == nullptr)
      recorded = Check(gpuEventCreateWithFlags(&st->used, gpuEventDisableTiming), "gpuEventCreate");
    if (recorded.ok()) recorded = Check(gpuEventRecord(st->used, S(stream)), "gpuEventRecord");
    if (recorded.ok()) st->last = stream;
    return s.ok() ? recorded : s;
  }

  // The BLAS handle on `stream`, in IEEE fp32 unless tf32 (st.mu held).
  Status Blas(DeviceState& st, Stream stream, bool tf32) {
    QLINK_RETURN_IF_ERROR(CheckBlas(api_.BlasSetStream(st.blas, stream), api_.names.blas_stream));
    if (st.blas_work != nullptr) {
      QLINK_RETURN_IF_ERROR(
          CheckBlas(api_.BlasSetWorkspace(st.blas, st.blas_work, kBlasWorkspaceBytes), api_.names.blas_workspace));
    }
    if (api_.BlasSetMathMode == nullptr) return Status::Ok();
    return CheckBlas(api_.BlasSetMathMode(st.blas, tf32 ? api_.math_tf32 : api_.math_default), api_.names.math);
  }

  Status Solver(DeviceState& st, Stream stream) {
    return CheckSolver(api_.SolverSetStream(st.solver, stream), api_.names.solver_stream);
  }

  static Status Work(DeviceState& st, int floats) {
    if (floats <= st.work_floats) return Status::Ok();
    if (st.work != nullptr) QLINK_RETURN_IF_ERROR(Check(gpuFree(st.work), "gpuFree"));
    st.work = nullptr;
    st.work_floats = 0;
    QLINK_RETURN_IF_ERROR(Check(gpuMalloc(reinterpret_cast<void**>(&st.work), sizeof(float) * floats), "gpuMalloc"));
    st.work_floats = floats;
    return Status::Ok();
  }

  // Grows trtri's host workspace. An earlier trtri, on any stream, may still be using the old
  // buffer after its call returned: the device is drained first, as gpuFree does for `work`.
  static Status HostWork(DeviceState& st, size_t bytes) {
    if (bytes <= st.host_work.size()) return Status::Ok();
    if (!st.host_work.empty()) QLINK_RETURN_IF_ERROR(Check(gpuDeviceSynchronize(), "gpuDeviceSynchronize"));
    st.host_work.resize(bytes);
    return Status::Ok();
  }

  static Status ReadInfo(DeviceState& st, Stream stream, int* info) {
    QLINK_RETURN_IF_ERROR(Check(gpuStreamSynchronize(S(stream)), "gpuStreamSynchronize"));
    return Check(gpuMemcpy(info, st.info, sizeof(int), gpuMemcpyDeviceToHost), "gpuMemcpy");
  }

  const LinalgApi& api_;
  const LibraryReport report_;
  std::vector<DeviceState> states_;
  std::vector<DeviceLanes> lanes_;
};

}  // namespace

Status MakeGpuQuantMath(const Libraries& libraries, int devices, std::unique_ptr<QuantMath>* out) {
  const LinalgApi* api = nullptr;
  QLINK_RETURN_IF_ERROR(LoadLinalg(libraries.blas, libraries.solver, &api));
  *out = std::make_unique<GpuQuantMath>(*api, devices);
  return Status::Ok();
}

}  // namespace quant
}  // namespace qlink
