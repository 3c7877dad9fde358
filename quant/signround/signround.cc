#include "quant/signround/signround.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/stream_list.h"
#include "quant/signround/signround_checks.h"
#include "quant/tensor_args.h"

namespace qlink {
namespace quant {
namespace {

bool IsFp32(DLDataType t) { return Is(t, kDLFloat, 32); }

// The format of a float dtype, or false.
bool FmtOf(DLDataType t, Fmt* out) {
  if (Is(t, kDLFloat, 32)) return *out = Fmt::kF32, true;
  if (Is(t, kDLBfloat, 16)) return *out = Fmt::kBf16, true;
  if (Is(t, kDLFloat, 16)) return *out = Fmt::kF16, true;
  return false;
}

void* DataOf(const DLTensor* t) { return t == nullptr ? nullptr : static_cast<char*>(t->data) + t->byte_offset; }

struct Options {
  SignRoundConfig config;  // but for the weight's format, which is per layer
  int64_t group_size = -1;
};

// A backward's SignSGD step of v (1.9): the learning rates and the best-loss pair.
struct VStep {
  float* lrs = nullptr;  // NULL: no step
  int64_t num_lrs = 0;
  int device = 0;
  const float* loss = nullptr;
  const float* best_loss = nullptr;
};

Status ReadOptions(const qlink_signround_options* o, Options* out) {
  if (o == nullptr) return InvalidArgument("args->options is NULL");
  QLINK_RETURN_IF_ERROR(CheckStructSize(o->struct_size, QLINK_SIGNROUND_OPTIONS_STRUCT_SIZE_1_7, "options", "1.7"));
  QLINK_RETURN_IF_ERROR(CheckBitsAndGroupSize(o->bits, o->group_size));
  if (!FmtOf(o->scale_dtype, &out->config.scale)) {
    return InvalidArgument("options->scale_dtype is " + DtypeName(o->scale_dtype) +
                           ", expected float16, bfloat16 or float32");
  }
  if (!(o->q_scale_thresh > 0) || std::isinf(o->q_scale_thresh)) {
    return InvalidArgument("options->q_scale_thresh = " + std::to_string(o->q_scale_thresh) +
                           " is not a finite value > 0");
  }
  out->config.bits = o->bits;
  out->config.sym = o->sym != 0 ? 1 : 0;
  // As torch.clamp converts a Python float for a tensor of the scale's dtype.
  out->config.thresh = RoundTo(out->config.scale, static_cast<float>(o->q_scale_thresh));
  out->group_size = o->group_size;
  return Status::Ok();
}

// A layer's part of a backward with a step: no grad_v, its best_v like v, its lr_group in
// range, on the step's device. like_v checks a tensor as v is checked.
template <typename LikeV>
Status ReadStep(const qlink_signround_layer& l, const std::string& who, const VStep& step, LikeV like_v) {
  if (l.struct_size < QLINK_SIGNROUND_LAYER_STRUCT_SIZE_1_9) {
    return InvalidArgument(who + ": struct_size " + std::to_string(l.struct_size) +
                           " ends before best_v and lr_group (1.9), which args->step_lrs needs");
  }
  if (l.grad_v != nullptr) return InvalidArgument(who + ": grad_v must be NULL with args->step_lrs (v takes the step)");
  if (l.weight->device.device_id != step.device) {
    return InvalidArgument(who + ": weight is on device " + std::to_string(l.weight->device.device_id) +
                           ", not args->step_lrs' device " + std::to_string(step.device));
  }
  if (l.best_v != nullptr) QLINK_RETURN_IF_ERROR(like_v(l.best_v, "best_v"));
  if (l.lr_group < 0 || l.lr_group >= step.num_lrs) {
    return InvalidArgument(who + ": lr_group = " + std::to_string(l.lr_group) + " is outside args->step_lrs' " +
                           std::to_string(step.num_lrs) + " groups");
  }
  return Status::Ok();
}

Status ReadLayer(const Context& ctx, const qlink_signround_layer& l, size_t index, const Options& options,
                 SignRoundPass pass, const VStep& step, CheckedLayer* out) {
  const std::string at = "layers[" + std::to_string(index) + "]";
  QLINK_RETURN_IF_ERROR(CheckStructSize(l.struct_size, QLINK_SIGNROUND_LAYER_STRUCT_SIZE_1_7, at.c_str(), "1.7"));
  const std::string who = LayerName(index, l.name);
  if (l.weight == nullptr) return InvalidArgument(who + ": weight is NULL");
  const DLTensor& w = *l.weight;
  QLINK_RETURN_IF_ERROR(CheckWeightMatrix(ctx, w, who));
  out->config = options.config;
  if (!FmtOf(w.dtype, &out->config.weight)) {
    return InvalidArgument(who + ": weight has dtype " + DtypeName(w.dtype) +
                           ", expected float32, bfloat16 or float16");
  }
  const int64_t rows = w.shape[0], cols = w.shape[1];
  if (options.group_size != -1 && cols % options.group_size != 0) {
    return InvalidArgument(who + ": options->group_size " + std::to_string(options.group_size) +
                           " does not divide the weight's " + std::to_string(cols) + " columns");
  }
  const int64_t len = options.group_size == -1 ? cols : options.group_size, groups = rows * cols / len;
  out->device = w.device.device_id;
  const DLDataType wd = w.dtype;
  auto like_weight = [wd](DLDataType t) { return t.code == wd.code && t.bits == wd.bits && t.lanes == 1; };
  const std::string wanted = "the weight's " + DtypeName(wd);
  auto need = [&](const DLTensor* t, const char* field, std::initializer_list<int64_t> shape, auto ok,
                  const char* dtype) -> Status {
    if (t == nullptr) return InvalidArgument(who + ": " + field + " is NULL");
    return CheckTensorOf(ctx, t, who + ": " + field, out->device, shape, ok, dtype);
  };
  QLINK_RETURN_IF_ERROR(need(l.v, "v", {groups, len}, IsFp32, "float32"));
  QLINK_RETURN_IF_ERROR(need(l.min_scale, "min_scale", {groups}, IsFp32, "float32"));
  QLINK_RETURN_IF_ERROR(need(l.max_scale, "max_scale", {groups}, IsFp32, "float32"));
  if (pass == SignRoundPass::kForward) {
    QLINK_RETURN_IF_ERROR(need(l.qdq, "qdq", {rows, cols}, like_weight, wanted.c_str()));
  } else {
    QLINK_RETURN_IF_ERROR(need(l.grad_qdq, "grad_qdq", {rows, cols}, like_weight, wanted.c_str()));
    if (step.lrs == nullptr) {
      QLINK_RETURN_IF_ERROR(need(l.grad_v, "grad_v", {groups, len}, IsFp32, "float32"));
    } else {
      QLINK_RETURN_IF_ERROR(ReadStep(l, who, step, [&](const DLTensor* t, const char* field) {
        return need(t, field, {groups, len}, IsFp32, "float32");
      }));
    }
    for (auto [t, field] : {std::pair{l.grad_min_scale, "grad_min_scale"}, {l.grad_max_scale, "grad_max_scale"}}) {
      if (t != nullptr) QLINK_RETURN_IF_ERROR(need(t, field, {groups}, IsFp32, "float32"));
    }
  }
  SignRoundLayer& s = out->layer;
  s.weight = DataOf(l.weight);
  s.rows = rows;
  s.cols = cols;
  s.group_len = len;
  s.v = static_cast<const float*>(DataOf(l.v));
  s.min_scale = static_cast<float*>(DataOf(l.min_scale));
  s.max_scale = static_cast<float*>(DataOf(l.max_scale));
  if (pass == SignRoundPass::kForward) {
    s.qdq = DataOf(l.qdq);
  } else {
    s.grad_qdq = DataOf(l.grad_qdq);
    s.grad_v = static_cast<float*>(DataOf(l.grad_v));
    if (step.lrs != nullptr) {
      s.step_v = static_cast<float*>(DataOf(l.v));
      s.best_v = static_cast<float*>(DataOf(l.best_v));
      s.step_lr = step.lrs + l.lr_group;
      s.loss = step.loss;
      s.best_loss = step.best_loss;
    }
    s.grad_min_scale = static_cast<float*>(DataOf(l.grad_min_scale));
    s.grad_max_scale = static_cast<float*>(DataOf(l.grad_max_scale));
  }
  return Status::Ok();
}

// A one-element tensor of `dtype` on `device`, named `what`.
Status CheckScalar(const Context& ctx, const DLTensor* t, const char* what, int device, DLDataType dtype,
                   const char* wanted) {
  if (t == nullptr) return InvalidArgument(std::string(what) + " is NULL");
  return CheckTensorOf(
      ctx, t, what, device, {1}, [&](DLDataType d) { return Is(d, dtype.code, dtype.bits); }, wanted);
}

// Learning rates, (groups,) fp32 with groups >= 1: their device and count.
Status ReadLrs(const Context& ctx, const DLTensor* t, const char* what, int* device, int64_t* count) {
  if (t == nullptr) return InvalidArgument(std::string(what) + " is NULL");
  uint64_t bytes = 0;
  QLINK_RETURN_IF_ERROR(
      CheckTensor(*t, std::string(what), ctx.backend().device_type(), ctx.backend().device_count(), &bytes));
  if (t->ndim != 1 || t->shape[0] < 1 || !IsFp32(t->dtype)) {
    return InvalidArgument(std::string(what) + " has shape " + ShapeText(*t) + " and dtype " + DtypeName(t->dtype) +
                           ", expected (groups,) float32 with groups >= 1");
  }
  *device = t->device.device_id;
  *count = t->shape[0];
  return Status::Ok();
}

// The best-loss pair, both (1,) fp32 on `device`, or neither (loss NULL).
Status ReadLossPair(const Context& ctx, const DLTensor* loss, const DLTensor* best_loss, int device,
                    const float** loss_out, float** best_loss_out) {
  if (loss == nullptr) return Status::Ok();
  const DLDataType fp32{kDLFloat, 32, 1};
  QLINK_RETURN_IF_ERROR(CheckScalar(ctx, loss, "args->loss", device, fp32, "float32"));
  QLINK_RETURN_IF_ERROR(CheckScalar(ctx, best_loss, "args->best_loss", device, fp32, "float32"));
  *loss_out = static_cast<const float*>(DataOf(loss));
  *best_loss_out = static_cast<float*>(DataOf(best_loss));
  return Status::Ok();
}

// A backward's step of v (1.9 fields; none in a shorter struct).
Status ReadVStep(const Context& ctx, const qlink_signround_args& args, SignRoundPass pass, VStep* out) {
  if (args.struct_size < QLINK_SIGNROUND_ARGS_STRUCT_SIZE_1_9) return Status::Ok();
  if (args.step_lrs == nullptr) {
    if (args.loss != nullptr || args.best_loss != nullptr)
      return InvalidArgument("args->loss and args->best_loss go with args->step_lrs, which is NULL");
    return Status::Ok();
  }
  if (pass == SignRoundPass::kForward)
    return InvalidArgument("args->step_lrs is signround_qdq_backward's: signround_qdq takes no step");
  QLINK_RETURN_IF_ERROR(ReadLrs(ctx, args.step_lrs, "args->step_lrs", &out->device, &out->num_lrs));
  float* best_loss = nullptr;
  QLINK_RETURN_IF_ERROR(ReadLossPair(ctx, args.loss, args.best_loss, out->device, &out->loss, &best_loss));
  out->best_loss = best_loss;
  out->lrs = static_cast<float*>(DataOf(args.step_lrs));
  return Status::Ok();
}

}  // namespace

Status CheckSignRoundArgs(const Context& ctx, const qlink_signround_args* args, SignRoundPass pass,
                          std::vector<CheckedLayer>* out) {
  if (args == nullptr) return InvalidArgument("args is NULL");
  QLINK_RETURN_IF_ERROR(CheckStructSize(args->struct_size, QLINK_SIGNROUND_ARGS_STRUCT_SIZE_1_7, "args", "1.7"));
  Options options;
  QLINK_RETURN_IF_ERROR(ReadOptions(args->options, &options));
  if (args->num_layers > 0 && args->layers == nullptr)
    return InvalidArgument("args->layers is NULL with num_layers > 0");
  QLINK_RETURN_IF_ERROR(CheckStreams(ctx, args->streams, args->num_streams));
  VStep step;
  QLINK_RETURN_IF_ERROR(ReadVStep(ctx, *args, pass, &step));
  out->assign(args->num_layers, CheckedLayer{});
  for (size_t i = 0; i < args->num_layers; ++i) {
    QLINK_RETURN_IF_ERROR(ReadLayer(ctx, args->layers[i], i, options, pass, step, &(*out)[i]));
  }
  return Status::Ok();
}

Status SignRoundQdq(Context& ctx, const qlink_signround_args* args, SignRoundPass pass) {
  std::vector<CheckedLayer> layers;
  QLINK_RETURN_IF_ERROR(CheckSignRoundArgs(ctx, args, pass, &layers));
  if (layers.empty()) return Status::Ok();
  SignRoundMath* math = nullptr;
  QLINK_RETURN_IF_ERROR(ctx.backend().GetSignRoundMath(&math));
  for (const CheckedLayer& l : layers) {
    const Stream stream = StreamFor(l.device, args->streams, args->num_streams);
    QLINK_RETURN_IF_ERROR(pass == SignRoundPass::kForward ? math->Forward(l.device, stream, l.config, l.layer)
                                                          : math->Backward(l.device, stream, l.config, l.layer));
  }
  return Status::Ok();
}

Status CheckSignSgdArgs(const Context& ctx, const qlink_signsgd_args* args, CheckedStep* out) {
  if (args == nullptr) return InvalidArgument("args is NULL");
  QLINK_RETURN_IF_ERROR(CheckStructSize(args->struct_size, QLINK_SIGNSGD_ARGS_STRUCT_SIZE_1_7, "args", "1.7"));
  if (args->num_params > 0 && args->params == nullptr)
    return InvalidArgument("args->params is NULL with num_params > 0");
  QLINK_RETURN_IF_ERROR(CheckStreams(ctx, args->streams, args->num_streams));
  int& device = out->device;
  int64_t num_lrs = 0;
  QLINK_RETURN_IF_ERROR(ReadLrs(ctx, args->lrs, "args->lrs", &device, &num_lrs));
  uint64_t bytes = 0;
  SignSgdStep& step = out->step;
  step = SignSgdStep{};
  step.lrs = static_cast<float*>(DataOf(args->lrs));
  step.num_lrs = static_cast<size_t>(num_lrs);
  if (args->epoch != nullptr) {
    QLINK_RETURN_IF_ERROR(CheckScalar(ctx, args->epoch, "args->epoch", device, DLDataType{kDLInt, 64, 1}, "int64"));
    if (args->total_iters < 1) {
      return InvalidArgument("args->total_iters = " + std::to_string(args->total_iters) + " is below 1 with an epoch");
    }
    step.epoch = static_cast<int64_t*>(DataOf(args->epoch));
    step.total_iters = args->total_iters;
  }
  QLINK_RETURN_IF_ERROR(ReadLossPair(ctx, args->loss, args->best_loss, device, &step.loss, &step.best_loss));
  std::vector<SignSgdTensor>& tensors = out->tensors;
  tensors.assign(args->num_params, SignSgdTensor{});
  for (size_t i = 0; i < args->num_params; ++i) {
    const qlink_signsgd_param& p = args->params[i];
    const std::string at = "params[" + std::to_string(i) + "]";
    QLINK_RETURN_IF_ERROR(CheckStructSize(p.struct_size, QLINK_SIGNSGD_PARAM_STRUCT_SIZE_1_7, at.c_str(), "1.7"));
    if (p.param == nullptr) return InvalidArgument(at + ": param is NULL");
    QLINK_RETURN_IF_ERROR(
        CheckTensor(*p.param, at + ": param", ctx.backend().device_type(), ctx.backend().device_count(), &bytes));
    if (p.param->device.device_id != device) {
      return InvalidArgument(at + ": param is on device " + std::to_string(p.param->device.device_id) +
                             ", not args->lrs's device " + std::to_string(device));
    }
    if (!IsFp32(p.param->dtype))
      return InvalidArgument(at + ": param has dtype " + DtypeName(p.param->dtype) + ", expected float32");
    int64_t count = 1;
    for (int d = 0; d < p.param->ndim; ++d) count *= p.param->shape[d];
    auto like_param = [&](const DLTensor* t, const char* field) -> Status {
      const std::string what = at + ": " + field;
      if (t == nullptr) return InvalidArgument(what + " is NULL");
      QLINK_RETURN_IF_ERROR(CheckTensor(*t, what, ctx.backend().device_type(), ctx.backend().device_count(), &bytes));
      bool same = t->ndim == p.param->ndim;
      for (int d = 0; same && d < t->ndim; ++d) same = t->shape[d] == p.param->shape[d];
      if (!same)
        return InvalidArgument(what + " has shape " + ShapeText(*t) + ", expected param's " + ShapeText(*p.param));
      if (t->device.device_id != device) {
        return InvalidArgument(what + " is on device " + std::to_string(t->device.device_id) + ", not " +
                               std::to_string(device));
      }
      if (!IsFp32(t->dtype)) return InvalidArgument(what + " has dtype " + DtypeName(t->dtype) + ", expected float32");
      return Status::Ok();
    };
    QLINK_RETURN_IF_ERROR(like_param(p.grad, "grad"));
    if (p.best != nullptr) QLINK_RETURN_IF_ERROR(like_param(p.best, "best"));
    if (p.lr_group < 0 || p.lr_group >= num_lrs) {
      return InvalidArgument(at + ": lr_group = " + std::to_string(p.lr_group) + " is outside args->lrs' " +
                             std::to_string(num_lrs) + " groups");
    }
    tensors[i] = SignSgdTensor{static_cast<float*>(DataOf(p.param)), static_cast<const float*>(DataOf(p.grad)),
                               static_cast<float*>(DataOf(p.best)), count, p.lr_group};
  }
  step.tensors = tensors.data();
  step.num_tensors = tensors.size();
  return Status::Ok();
}

Status SignSgd(Context& ctx, const qlink_signsgd_args* args) {
  CheckedStep checked;
  QLINK_RETURN_IF_ERROR(CheckSignSgdArgs(ctx, args, &checked));
  SignRoundMath* math = nullptr;
  QLINK_RETURN_IF_ERROR(ctx.backend().GetSignRoundMath(&math));
  return math->Step(checked.device, StreamFor(checked.device, args->streams, args->num_streams), checked.step);
}

}  // namespace quant
}  // namespace qlink
