// What every C ABI entry point does around its own work, written once: an escaping
// exception or a failed Status becomes a qlink_status plus this thread's message, a NULL
// handle is refused naming its parameter, and the host's current device is restored on
// return (backends leave the device of their last enqueue current).
#pragma once

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "core/handles.h"
#include "core/tensor_check.h"

namespace qlink {

// This thread's message of the last call (last_error()); empty after a success.
std::string& LastErrorOfThread();

template <typename F>
qlink_status Guard(F&& body) {
  Status s;
  try {
    s = body();
  } catch (const std::bad_alloc&) {
    s = OutOfMemory("host memory exhausted");
  } catch (const std::exception& e) {
    s = Internal(std::string("unexpected exception: ") + e.what());
  } catch (...) {
    s = Internal("unexpected non-standard exception");
  }
  LastErrorOfThread() = s.message();
  return s.code();
}

inline Status CheckNotNull(const void* p, const char* what) {
  return p == nullptr ? InvalidArgument(std::string(what) + " is NULL") : Status::Ok();
}

// The preamble of an entry point on `handle` (called `what` in the header): body(*handle).
template <typename Handle, typename F>
qlink_status OnHandle(Handle* handle, const char* what, F&& body) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(handle, what));
    DeviceRestore restore(ContextOf(*handle).backend());
    return body(*handle);
  });
}

template <typename F>
qlink_status OnContext(const qlink_context* ctx, F&& body) {
  return OnHandle(ctx, "ctx", [&](const qlink_context& h) { return body(*h.impl); });
}

template <typename F>
qlink_status OnComm(qlink_comm* comm, F&& body) {
  return OnHandle(comm, "comm", [&](qlink_comm& h) { return body(*h.impl); });
}

// Destroying NULL does nothing. The host's device is restored after the handle, which may
// free device memory, is gone; its context outlives it.
template <typename Handle>
qlink_status DestroyHandle(Handle* handle) {
  return Guard([&] {
    if (handle == nullptr) return Status::Ok();
    DeviceRestore restore(ContextOf(*handle).backend());
    delete handle;
    return Status::Ok();
  });
}

// Creates a handle for *out (called `what` in the header): *out stays NULL unless
// fill(handle) succeeds.
template <typename Handle, typename Fill>
Status MakeHandle(Handle** out, const char* what, Fill&& fill) {
  QLINK_RETURN_IF_ERROR(CheckNotNull(out, what));
  *out = nullptr;
  auto handle = std::make_unique<Handle>();
  QLINK_RETURN_IF_ERROR(fill(*handle));
  *out = handle.release();
  return Status::Ok();
}

// Copies `full` into the caller's struct, no byte past the struct_size it set.
template <typename T>
Status WriteVersioned(const T& full, T* out, size_t min_size, const char* what) {
  QLINK_RETURN_IF_ERROR(CheckNotNull(out, what));
  const size_t caller_size = out->struct_size;
  QLINK_RETURN_IF_ERROR(CheckStructSize(caller_size, min_size, what, "1.0"));
  std::memcpy(out, &full, std::min(caller_size, sizeof(T)));
  out->struct_size = caller_size;
  return Status::Ok();
}

}  // namespace qlink
