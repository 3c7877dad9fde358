// Deterministic reduce (GPTQ Hessian partials): one ReduceSum on the output's device over
// every partial in device-index order, read in place or staged.
#include <cmath>
#include <string>
#include <vector>

#include "core/collective_buffers.h"
#include "core/collectives.h"
#include "core/stream_joins.h"
#include "core/stream_list.h"
#include "core/tensor_check.h"

namespace qlink {

Status Reduce(Context& ctx, const qlink_reduce_args* a) {
  if (a == nullptr) return InvalidArgument("args is NULL");
  QLINK_RETURN_IF_ERROR(CheckStructSize(a->struct_size, QLINK_REDUCE_ARGS_STRUCT_SIZE_1_1, "args", "1.1"));
  QLINK_RETURN_IF_ERROR(CheckStreams(ctx, a->streams, a->num_streams));
  uint64_t bytes = 0;
  std::vector<size_t> order;
  QLINK_RETURN_IF_ERROR(CheckPerDevice(ctx, a->inputs, a->num_inputs, "inputs", &bytes, &order));
  if (a->output == nullptr) return InvalidArgument("args.output is NULL");
  DeviceBackend& b = ctx.backend();
  uint64_t out_bytes = 0;
  QLINK_RETURN_IF_ERROR(CheckTensor(*a->output, "output", 0, b.device_type(), b.device_count(), &out_bytes));
  QLINK_RETURN_IF_ERROR(CheckFp32(*a->output, "output", 0));
  if (out_bytes != bytes) {
    return InvalidArgument("output has " + std::to_string(out_bytes) + " bytes but inputs[0] has " +
                           std::to_string(bytes));
  }
  const int o = a->output->device.device_id;
  const char* out = TensorBytes(*a->output);
  for (size_t i = 0; i < a->num_inputs; ++i) {
    const char* in = TensorBytes(a->inputs[i]);
    const bool in_place = in == out && a->inputs[i].device.device_id == o;
    if (!in_place && bytes > 0 && in < out + bytes && out < in + bytes) {
      return InvalidArgument("output overlaps " + ArgName("inputs", i) +
                             " (only the input of the output's own device "
                             "may be the output itself)");
    }
  }
  if (!std::isfinite(a->scale)) return InvalidArgument("args.scale is not finite");
  if (bytes == 0) return Status::Ok();

  StreamJoins joins(ctx);
  Stream os = StreamFor(o, a->streams, a->num_streams);
  for (size_t i : order) {
    const int d = a->inputs[i].device.device_id;
    Stream ds = StreamFor(d, a->streams, a->num_streams);
    if (d == o || b.StreamIdle(d, ds)) continue;
    Event e = nullptr;
    QLINK_RETURN_IF_ERROR(joins.Record(d, ds, &e));
    QLINK_RETURN_IF_ERROR(joins.Wait(o, os, e));
  }
  BorrowedScratch staged(ctx.scratch());
  std::vector<const void*> partials;
  for (size_t i : order) {
    const DLTensor& in = a->inputs[i];
    const void* p = nullptr;
    QLINK_RETURN_IF_ERROR(Readable(ctx, o, in.device.device_id, TensorBytes(in), bytes, os, &staged, &p));
    partials.push_back(p);
  }
  QLINK_RETURN_IF_ERROR(b.ReduceSum(o, const_cast<char*>(out), partials.data(), partials.size(), false, bytes / 4,
                                    static_cast<float>(a->scale), false, os));
  QLINK_RETURN_IF_ERROR(staged.GiveBack());
  // Backward join: the partials may be reused on their streams once read.
  Event done = nullptr;
  QLINK_RETURN_IF_ERROR(joins.Record(o, os, &done));
  for (size_t i : order) {
    const int d = a->inputs[i].device.device_id;
    if (d != o) QLINK_RETURN_IF_ERROR(joins.Wait(d, StreamFor(d, a->streams, a->num_streams), done));
  }
  return Status::Ok();
}

}  // namespace qlink
