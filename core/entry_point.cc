#include "core/entry_point.h"

namespace qlink {

std::string& LastErrorOfThread() {
  thread_local std::string message;
  return message;
}

}  // namespace qlink
