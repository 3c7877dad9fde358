#include "quant/signround/signround_experts.h"

#include <string>
#include <vector>

#include "core/stream_list.h"
#include "quant/signround/signround_checks.h"
#include "quant/tensor_args.h"

namespace qlink {
namespace quant {
namespace {

void* DataOf(const DLTensor* t) { return t == nullptr ? nullptr : static_cast<char*>(t->data) + t->byte_offset; }

// A refusal of the struct `path` points to, named from the outer args: the inner checks
// say "args->options" or "layers[2]", which become "args->layers->options" and
// "args->layers->layers[2]".
Status Within(Status s, const std::string& path) {
  if (s.ok() || s.code() != QLINK_INVALID_ARGUMENT) return s;
  const std::string& m = s.message();
  const bool rooted = m.compare(0, 4, "args") == 0;
  return InvalidArgument(path + (rooted ? m.substr(4) : "->" + m));
}

// The token counts: NULL, or (count,) int32 / int64 on `device`.
Status ReadTokens(const Context& ctx, const DLTensor* t, size_t count, int device, ExpertTokens* out) {
  if (t == nullptr) return Status::Ok();
  const int64_t n = static_cast<int64_t>(count);
  QLINK_RETURN_IF_ERROR(CheckTensorOf(
      ctx, t, "args->tokens", device, {n}, [](DLDataType d) { return Is(d, kDLInt, 32) || Is(d, kDLInt, 64); },
      "int32 or int64"));
  out->counts = DataOf(t);
  out->bits = t->dtype.bits;
  return Status::Ok();
}

// Every expert like the first: one device, shape and weight dtype (one kernel grid).
Status CheckAlike(const qlink_signround_args& args, const std::vector<CheckedLayer>& layers) {
  const CheckedLayer& first = layers[0];
  for (size_t i = 1; i < layers.size(); ++i) {
    const CheckedLayer& l = layers[i];
    const std::string who = "args->layers->" + LayerName(i, args.layers[i].name);
    if (l.device != first.device) {
      return InvalidArgument(who + ": weight is on device " + std::to_string(l.device) + ", not layers[0]'s device " +
                             std::to_string(first.device) + " (the experts of one call share a device)");
    }
    if (l.layer.rows != first.layer.rows || l.layer.cols != first.layer.cols ||
        l.config.weight != first.config.weight) {
      return InvalidArgument(who + ": weight has shape " + ShapeText(*args.layers[i].weight) + " and dtype " +
                             DtypeName(args.layers[i].weight->dtype) + ", unlike layers[0]'s " +
                             ShapeText(*args.layers[0].weight) + " " + DtypeName(args.layers[0].weight->dtype) +
                             " (the experts of one call are same-shaped)");
    }
  }
  return Status::Ok();
}

}  // namespace

Status SignRoundExpertsQdq(Context& ctx, const qlink_signround_experts_args* args, SignRoundPass pass) {
  if (args == nullptr) return InvalidArgument("args is NULL");
  QLINK_RETURN_IF_ERROR(
      CheckStructSize(args->struct_size, QLINK_SIGNROUND_EXPERTS_ARGS_STRUCT_SIZE_1_10, "args", "1.10"));
  if (args->layers == nullptr) return InvalidArgument("args->layers is NULL");
  std::vector<CheckedLayer> layers;
  QLINK_RETURN_IF_ERROR(Within(CheckSignRoundArgs(ctx, args->layers, pass, &layers), "args->layers"));
  if (layers.empty()) {
    ExpertTokens none;
    return args->tokens == nullptr ? Status::Ok()
                                   : ReadTokens(ctx, args->tokens, 0, args->tokens->device.device_id, &none);
  }
  QLINK_RETURN_IF_ERROR(CheckAlike(*args->layers, layers));
  const int device = layers[0].device;
  SignRoundExperts experts;
  QLINK_RETURN_IF_ERROR(ReadTokens(ctx, args->tokens, layers.size(), device, &experts.tokens));
  std::vector<SignRoundLayer> list(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) list[i] = layers[i].layer;
  experts.layers = list.data();
  experts.count = list.size();
  SignRoundMath* math = nullptr;
  QLINK_RETURN_IF_ERROR(ctx.backend().GetSignRoundMath(&math));
  const Stream stream = StreamFor(device, args->layers->streams, args->layers->num_streams);
  return pass == SignRoundPass::kForward ? math->ForwardExperts(device, stream, layers[0].config, experts)
                                         : math->BackwardExperts(device, stream, layers[0].config, experts);
}

Status SignSgdExperts(Context& ctx, const qlink_signsgd_experts_args* args) {
  if (args == nullptr) return InvalidArgument("args is NULL");
  QLINK_RETURN_IF_ERROR(
      CheckStructSize(args->struct_size, QLINK_SIGNSGD_EXPERTS_ARGS_STRUCT_SIZE_1_10, "args", "1.10"));
  if (args->step == nullptr) return InvalidArgument("args->step is NULL");
  CheckedStep checked;
  QLINK_RETURN_IF_ERROR(Within(CheckSignSgdArgs(ctx, args->step, &checked), "args->step"));
  const size_t experts = args->num_experts, params = checked.tensors.size();
  if (experts == 0 || params % experts != 0) {
    return InvalidArgument("args->num_experts = " + std::to_string(experts) + " does not divide args->step's " +
                           std::to_string(params) + " params into experts of as many each");
  }
  const size_t per_expert = params / experts;
  for (size_t i = per_expert; i < params; ++i) {
    const SignSgdTensor& t = checked.tensors[i];
    const SignSgdTensor& first = checked.tensors[i % per_expert];
    if (t.count != first.count) {
      return InvalidArgument("args->step->params[" + std::to_string(i) + "] (expert " + std::to_string(i / per_expert) +
                             "'s tensor " + std::to_string(i % per_expert) + ") has " + std::to_string(t.count) +
                             " elements, unlike expert 0's " + std::to_string(first.count));
    }
  }
  ExpertTokens tokens;
  QLINK_RETURN_IF_ERROR(ReadTokens(ctx, args->tokens, experts, checked.device, &tokens));
  SignRoundMath* math = nullptr;
  QLINK_RETURN_IF_ERROR(ctx.backend().GetSignRoundMath(&math));
  const Stream stream = StreamFor(checked.device, args->step->streams, args->step->num_streams);
  return math->StepExperts(checked.device, stream, checked.step, experts, tokens);
}

}  // namespace quant
}  // namespace qlink
