#include "quant/gptq/engine_math.h"

#include <mutex>
#include <set>
#include <string>

namespace qlink {
namespace quant {

Status GetEngineMath(Context& ctx, QuantMath** out) {
  QLINK_RETURN_IF_ERROR(ctx.backend().GetQuantMath(out));
  const LibraryReport& report = (*out)->libraries();
  const auto level = report.warning.empty() ? spdlog::level::info : spdlog::level::warn;
  if (!ctx.log().should_log(level)) return Status::Ok();  // said by the first context that shows it
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  if (!said.insert(report.loaded).second) return Status::Ok();
  if (report.warning.empty()) {
    ctx.log().info("quant: the {} backend's GPTQ engine runs on {}", ctx.backend().name(), report.loaded);
  } else {
    ctx.log().warn("quant: {}", report.warning);
  }
  return Status::Ok();
}

}  // namespace quant
}  // namespace qlink
