// Logging through spdlog: one stderr sink per process, one logger per context at the
// context's configured level, one-line summaries.
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace qlink {

// level: one of the names config.cc accepts.
std::shared_ptr<spdlog::logger> MakeLogger(const std::string& level);

}  // namespace qlink
