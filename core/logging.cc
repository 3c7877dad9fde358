#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace qlink {

std::shared_ptr<spdlog::logger> MakeLogger(const std::string& level) {
  static const auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("qlink", sink);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [qlink] [%^%l%$] %v");
  logger->set_level(spdlog::level::from_str(level));
  return logger;
}

}  // namespace qlink
