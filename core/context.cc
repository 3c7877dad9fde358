#include "core/context.h"

#include "core/logging.h"

namespace qlink {

Status Context::Create(const char* config_json, std::unique_ptr<Context>* out) {
  std::unique_ptr<Context> ctx(new Context());
  QLINK_RETURN_IF_ERROR(ParseConfig(config_json, &ctx->config_));
  ctx->log_ = MakeLogger(ctx->config_.log_level);
  QLINK_RETURN_IF_ERROR(LoadBackend(ctx->config_, *ctx->log_, &ctx->loaded_));
  ctx->topology_ = std::make_unique<Topology>(*ctx->loaded_.backend, ctx->config_.p2p, *ctx->log_);
  ctx->events_ = std::make_unique<EventPool>(*ctx->loaded_.backend);
  ctx->scratch_ = std::make_unique<ScratchPool>(*ctx->loaded_.backend);
  ctx->one_shot_ = std::make_unique<OneShotWorkspaces>(*ctx->loaded_.backend);
  ctx->log_->debug("context created: backend {} with {} device(s), p2p.mode {}", ctx->backend().name(),
                   ctx->backend().device_count(), ToString(ctx->config_.p2p.mode));
  *out = std::move(ctx);
  return Status::Ok();
}

Context::~Context() {
  // The pool and topology hold events and references into the backend, which goes last.
  if (!loaded_.backend) return;  // creation failed before the backend loaded
  DeviceRestore restore(backend());
  one_shot_.reset();
  scratch_.reset();
  events_.reset();
  topology_.reset();
}

Status Context::CheckDevice(int device, const char* what) const {
  if (device < 0 || device >= backend().device_count()) {
    return InvalidArgument(std::string(what) + " = " + std::to_string(device) + " does not exist (the context has " +
                           std::to_string(backend().device_count()) + " device(s))");
  }
  return Status::Ok();
}

}  // namespace qlink
