// Test only: cuSOLVER's few functions the GPU engine loads, forwarded to the real
// libcusolver.so.12, except that the process's first cusolverDnCreate fails with
// CUSOLVER_STATUS_NOT_INITIALIZED: the engine must then keep no half-made device state
// (its BLAS handle made, its solver handle not) and succeed on the next call, naming the
// status of the one that failed. Pointed at by config solver_library (test_cuda_quant.py).
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>

namespace {

void* Real(const char* name) {
  static void* library = dlopen("libcusolver.so.12", RTLD_NOW | RTLD_LOCAL);
  void* fn = library != nullptr ? dlsym(library, name) : nullptr;
  if (fn == nullptr) std::abort();  // the GPU machine has cuSOLVER; anything else is a broken test
  return fn;
}

template <typename Fn, typename... Args>
int Forward(const char* name, Args... args) {
  return reinterpret_cast<Fn*>(Real(name))(args...);
}

std::atomic<int> creates{0};

}  // namespace

extern "C" {

int cusolverDnCreate(void** handle) {
  if (creates.fetch_add(1) == 0) return 1;  // CUSOLVER_STATUS_NOT_INITIALIZED
  return Forward<int(void**)>("cusolverDnCreate", handle);
}
int cusolverDnDestroy(void* handle) { return Forward<int(void*)>("cusolverDnDestroy", handle); }
int cusolverDnSetStream(void* handle, void* stream) {
  return Forward<int(void*, void*)>("cusolverDnSetStream", handle, stream);
}
int cusolverDnSpotrf_bufferSize(void* handle, int uplo, int n, float* a, int lda, int* lwork) {
  return Forward<int(void*, int, int, float*, int, int*)>("cusolverDnSpotrf_bufferSize", handle, uplo, n, a, lda,
                                                          lwork);
}
int cusolverDnSpotrf(void* handle, int uplo, int n, float* a, int lda, float* work, int lwork, int* info) {
  return Forward<int(void*, int, int, float*, int, float*, int, int*)>("cusolverDnSpotrf", handle, uplo, n, a, lda,
                                                                       work, lwork, info);
}
int cusolverDnSpotrs(void* handle, int uplo, int n, int nrhs, const float* a, int lda, float* b, int ldb, int* info) {
  return Forward<int(void*, int, int, int, const float*, int, float*, int, int*)>("cusolverDnSpotrs", handle, uplo, n,
                                                                                  nrhs, a, lda, b, ldb, info);
}

}  // extern "C"
