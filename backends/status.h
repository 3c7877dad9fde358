// The error model shared by core and every backend: a qlink_status plus a message that
// names the offending argument. Exceptions never cross the C ABI; this does. It lives in
// backends/, the lower of the two layers, so both use it and backends include nothing of
// core. Part of the backend interface: a change here moves QLINK_BACKEND_INTERFACE_VERSION.
#pragma once

#include <string>
#include <utility>

#include "plugin_api/qlink.h"

namespace qlink {

class Status {
 public:
  Status() = default;
  Status(qlink_status code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == QLINK_OK; }
  qlink_status code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  qlink_status code_ = QLINK_OK;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return Status(QLINK_INVALID_ARGUMENT, std::move(m)); }
inline Status Unavailable(std::string m) { return Status(QLINK_UNAVAILABLE, std::move(m)); }
inline Status RuntimeError(std::string m) { return Status(QLINK_RUNTIME_ERROR, std::move(m)); }
inline Status OutOfMemory(std::string m) { return Status(QLINK_OUT_OF_MEMORY, std::move(m)); }
inline Status Internal(std::string m) { return Status(QLINK_INTERNAL, std::move(m)); }

}  // namespace qlink

#define QLINK_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::qlink::Status qlink_status_ = (expr);        \
    if (!qlink_status_.ok()) return qlink_status_; \
  } while (0)
