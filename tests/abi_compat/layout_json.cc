// Prints the live header's layout as JSON, for the Python package's ctypes mirror of it
// (python/qlink/_abi.py) to be checked against (tests/python/test_abi_mirror.py): every
// struct's size, size macro and fields (offset, size, kind), every function-table slot
// with its parameters' and result's kind and size, and every enumerator.
//
// A field, slot or enumerator added to qlink.h goes here too; the Python test fails while
// _abi.py mirrors one this dump does not list, and a struct size or *_STRUCT_SIZE macro
// this dump reads catches what neither lists.
#include <cstddef>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "plugin_api/qlink.h"

namespace {

// "i" integer or enum, "f" floating point, "p" pointer, "a" array, "s" struct; then the size.
template <typename T>
std::string Kind() {
  const char* kind = std::is_array<T>::value            ? "a"
                     : std::is_floating_point<T>::value ? "f"
                     : std::is_pointer<T>::value        ? "p"
                     : std::is_class<T>::value          ? "s"
                                                        : "i";
  return std::string("[\"") + kind + "\", " + std::to_string(sizeof(T)) + "]";
}

template <typename R, typename... A>
std::string Signature(R (*)(A...)) {
  std::string params;
  for (const std::string& p : {std::string(), Kind<A>()...}) {
    if (!p.empty()) params += (params.empty() ? "" : ", ") + p;
  }
  return "{\"result\": " + Kind<R>() + ", \"params\": [" + params + "]}";
}

std::string Quoted(const char* s) { return std::string("\"") + s + "\""; }

// One JSON object per struct: {"size": .., "size_macro": .., "fields": [[name, offset, kind], ..]}.
class Structs {
 public:
  void Begin(const char* name, size_t size, size_t size_macro) {
    Close();
    out_ += std::string(out_.empty() ? "" : ",\n") + "  " + Quoted(name) + ": {\"size\": " + std::to_string(size) +
            ", \"size_macro\": " + std::to_string(size_macro) + ", \"fields\": [";
    first_field_ = true;
  }
  void Field(const char* name, size_t offset, const std::string& kind) {
    out_ +=
        std::string(first_field_ ? "" : ", ") + "[" + Quoted(name) + ", " + std::to_string(offset) + ", " + kind + "]";
    first_field_ = false;
  }
  std::string Done() {
    Close();
    return out_;
  }

 private:
  void Close() {
    if (!out_.empty() && out_.back() != '}') out_ += "]}";
  }
  std::string out_;
  bool first_field_ = true;
};

}  // namespace

int main() {
  Structs s;
#define STRUCT(type, size_macro) s.Begin(#type, sizeof(type), size_macro)
#define FIELD(type, field) \
  s.Field(#field, offsetof(type, field), Kind<std::remove_reference_t<decltype(((type*)nullptr)->field)>>())
  STRUCT(DLDevice, sizeof(DLDevice));
  FIELD(DLDevice, device_type);
  FIELD(DLDevice, device_id);
  STRUCT(DLDataType, sizeof(DLDataType));
  FIELD(DLDataType, code);
  FIELD(DLDataType, bits);
  FIELD(DLDataType, lanes);
  STRUCT(DLTensor, sizeof(DLTensor));
  FIELD(DLTensor, data);
  FIELD(DLTensor, device);
  FIELD(DLTensor, ndim);
  FIELD(DLTensor, dtype);
  FIELD(DLTensor, shape);
  FIELD(DLTensor, strides);
  FIELD(DLTensor, byte_offset);
  STRUCT(qlink_device_info, QLINK_DEVICE_INFO_STRUCT_SIZE);
  FIELD(qlink_device_info, struct_size);
  FIELD(qlink_device_info, device);
  FIELD(qlink_device_info, name);
  FIELD(qlink_device_info, total_bytes);
  FIELD(qlink_device_info, free_bytes);
  STRUCT(qlink_peer_info, QLINK_PEER_INFO_STRUCT_SIZE);
  FIELD(qlink_peer_info, struct_size);
  FIELD(qlink_peer_info, src_device);
  FIELD(qlink_peer_info, dst_device);
  FIELD(qlink_peer_info, state);
  FIELD(qlink_peer_info, probed);
  FIELD(qlink_peer_info, peer_gbps);
  FIELD(qlink_peer_info, regular_gbps);
  FIELD(qlink_peer_info, reason);
  STRUCT(qlink_link_measurement, QLINK_LINK_MEASUREMENT_STRUCT_SIZE);
  FIELD(qlink_link_measurement, struct_size);
  FIELD(qlink_link_measurement, bytes);
  FIELD(qlink_link_measurement, gbps);
  FIELD(qlink_link_measurement, latency_us);
  FIELD(qlink_link_measurement, used_peer);
  STRUCT(qlink_stream, sizeof(qlink_stream));
  FIELD(qlink_stream, device);
  FIELD(qlink_stream, stream);
  STRUCT(qlink_copy_args, QLINK_COPY_ARGS_STRUCT_SIZE);
  FIELD(qlink_copy_args, struct_size);
  FIELD(qlink_copy_args, sources);
  FIELD(qlink_copy_args, destinations);
  FIELD(qlink_copy_args, num_leaves);
  FIELD(qlink_copy_args, streams);
  FIELD(qlink_copy_args, num_streams);
  FIELD(qlink_copy_args, flags);
  STRUCT(qlink_broadcast_args, QLINK_BROADCAST_ARGS_STRUCT_SIZE);
  FIELD(qlink_broadcast_args, struct_size);
  FIELD(qlink_broadcast_args, sources);
  FIELD(qlink_broadcast_args, num_leaves);
  FIELD(qlink_broadcast_args, destinations);
  FIELD(qlink_broadcast_args, num_replicas);
  FIELD(qlink_broadcast_args, streams);
  FIELD(qlink_broadcast_args, num_streams);
  FIELD(qlink_broadcast_args, flags);
  STRUCT(qlink_reduce_args, QLINK_REDUCE_ARGS_STRUCT_SIZE);
  FIELD(qlink_reduce_args, struct_size);
  FIELD(qlink_reduce_args, inputs);
  FIELD(qlink_reduce_args, num_inputs);
  FIELD(qlink_reduce_args, output);
  FIELD(qlink_reduce_args, scale);
  FIELD(qlink_reduce_args, streams);
  FIELD(qlink_reduce_args, num_streams);
  STRUCT(qlink_all_reduce_args, QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE);
  FIELD(qlink_all_reduce_args, struct_size);
  FIELD(qlink_all_reduce_args, buffers);
  FIELD(qlink_all_reduce_args, num_buffers);
  FIELD(qlink_all_reduce_args, op);
  FIELD(qlink_all_reduce_args, transport);
  FIELD(qlink_all_reduce_args, streams);
  FIELD(qlink_all_reduce_args, num_streams);
  FIELD(qlink_all_reduce_args, algorithm);
  STRUCT(qlink_hessian_args, QLINK_HESSIAN_ARGS_STRUCT_SIZE);
  FIELD(qlink_hessian_args, struct_size);
  FIELD(qlink_hessian_args, inputs);
  FIELD(qlink_hessian_args, num_inputs);
  FIELD(qlink_hessian_args, partials);
  FIELD(qlink_hessian_args, num_partials);
  FIELD(qlink_hessian_args, streams);
  FIELD(qlink_hessian_args, num_streams);
  FIELD(qlink_hessian_args, precision);
  FIELD(qlink_hessian_args, input_partials);
  STRUCT(qlink_gptq_options, QLINK_GPTQ_OPTIONS_STRUCT_SIZE);
  FIELD(qlink_gptq_options, struct_size);
  FIELD(qlink_gptq_options, bits);
  FIELD(qlink_gptq_options, group_size);
  FIELD(qlink_gptq_options, sym);
  FIELD(qlink_gptq_options, desc_act);
  FIELD(qlink_gptq_options, static_groups);
  FIELD(qlink_gptq_options, tf32);
  FIELD(qlink_gptq_options, damp);
  FIELD(qlink_gptq_options, damp_auto_increment);
  FIELD(qlink_gptq_options, nsamples);
  FIELD(qlink_gptq_options, act_group_aware);
  FIELD(qlink_gptq_options, inverse);
  STRUCT(qlink_gptq_layer, QLINK_GPTQ_LAYER_STRUCT_SIZE);
  FIELD(qlink_gptq_layer, struct_size);
  FIELD(qlink_gptq_layer, name);
  FIELD(qlink_gptq_layer, weight);
  FIELD(qlink_gptq_layer, hessian);
  FIELD(qlink_gptq_layer, codes);
  FIELD(qlink_gptq_layer, scales);
  FIELD(qlink_gptq_layer, zeros);
  FIELD(qlink_gptq_layer, g_idx);
  FIELD(qlink_gptq_layer, dequantized);
  FIELD(qlink_gptq_layer, loss);
  FIELD(qlink_gptq_layer, damp);
  STRUCT(qlink_gptq_args, QLINK_GPTQ_ARGS_STRUCT_SIZE);
  FIELD(qlink_gptq_args, struct_size);
  FIELD(qlink_gptq_args, options);
  FIELD(qlink_gptq_args, layers);
  FIELD(qlink_gptq_args, num_layers);
  FIELD(qlink_gptq_args, devices);
  FIELD(qlink_gptq_args, num_devices);
  FIELD(qlink_gptq_args, streams);
  FIELD(qlink_gptq_args, num_streams);
  STRUCT(qlink_signround_options, QLINK_SIGNROUND_OPTIONS_STRUCT_SIZE);
  FIELD(qlink_signround_options, struct_size);
  FIELD(qlink_signround_options, bits);
  FIELD(qlink_signround_options, group_size);
  FIELD(qlink_signround_options, sym);
  FIELD(qlink_signround_options, scale_dtype);
  FIELD(qlink_signround_options, q_scale_thresh);
  STRUCT(qlink_signround_layer, QLINK_SIGNROUND_LAYER_STRUCT_SIZE);
  FIELD(qlink_signround_layer, struct_size);
  FIELD(qlink_signround_layer, name);
  FIELD(qlink_signround_layer, weight);
  FIELD(qlink_signround_layer, v);
  FIELD(qlink_signround_layer, min_scale);
  FIELD(qlink_signround_layer, max_scale);
  FIELD(qlink_signround_layer, qdq);
  FIELD(qlink_signround_layer, grad_qdq);
  FIELD(qlink_signround_layer, grad_v);
  FIELD(qlink_signround_layer, grad_min_scale);
  FIELD(qlink_signround_layer, grad_max_scale);
  FIELD(qlink_signround_layer, best_v);
  FIELD(qlink_signround_layer, lr_group);
  STRUCT(qlink_signround_args, QLINK_SIGNROUND_ARGS_STRUCT_SIZE);
  FIELD(qlink_signround_args, struct_size);
  FIELD(qlink_signround_args, options);
  FIELD(qlink_signround_args, layers);
  FIELD(qlink_signround_args, num_layers);
  FIELD(qlink_signround_args, streams);
  FIELD(qlink_signround_args, num_streams);
  FIELD(qlink_signround_args, step_lrs);
  FIELD(qlink_signround_args, loss);
  FIELD(qlink_signround_args, best_loss);
  STRUCT(qlink_signsgd_param, QLINK_SIGNSGD_PARAM_STRUCT_SIZE);
  FIELD(qlink_signsgd_param, struct_size);
  FIELD(qlink_signsgd_param, param);
  FIELD(qlink_signsgd_param, grad);
  FIELD(qlink_signsgd_param, best);
  FIELD(qlink_signsgd_param, lr_group);
  STRUCT(qlink_signsgd_args, QLINK_SIGNSGD_ARGS_STRUCT_SIZE);
  FIELD(qlink_signsgd_args, struct_size);
  FIELD(qlink_signsgd_args, params);
  FIELD(qlink_signsgd_args, num_params);
  FIELD(qlink_signsgd_args, lrs);
  FIELD(qlink_signsgd_args, epoch);
  FIELD(qlink_signsgd_args, total_iters);
  FIELD(qlink_signsgd_args, loss);
  FIELD(qlink_signsgd_args, best_loss);
  FIELD(qlink_signsgd_args, streams);
  FIELD(qlink_signsgd_args, num_streams);
  STRUCT(qlink_signround_experts_args, QLINK_SIGNROUND_EXPERTS_ARGS_STRUCT_SIZE);
  FIELD(qlink_signround_experts_args, struct_size);
  FIELD(qlink_signround_experts_args, layers);
  FIELD(qlink_signround_experts_args, tokens);
  STRUCT(qlink_signsgd_experts_args, QLINK_SIGNSGD_EXPERTS_ARGS_STRUCT_SIZE);
  FIELD(qlink_signsgd_experts_args, struct_size);
  FIELD(qlink_signsgd_experts_args, step);
  FIELD(qlink_signsgd_experts_args, num_experts);
  FIELD(qlink_signsgd_experts_args, tokens);
  STRUCT(qlink_unique_id, sizeof(qlink_unique_id));
  FIELD(qlink_unique_id, bytes);
  STRUCT(qlink_api, QLINK_API_STRUCT_SIZE);
  FIELD(qlink_api, struct_size);
  FIELD(qlink_api, abi_major);
  FIELD(qlink_api, abi_minor);
#undef FIELD
#undef STRUCT

  // Slots in table order, each with its offset and signature.
  std::vector<std::string> slots;
#define SLOT(name)                                                                                \
  slots.push_back("[" + Quoted(#name) + ", " + std::to_string(offsetof(qlink_api, name)) + ", " + \
                  Signature(static_cast<decltype(qlink_api::name)>(nullptr)) + "]")
  SLOT(last_error);
  SLOT(context_create);
  SLOT(context_destroy);
  SLOT(backend_name);
  SLOT(device_count);
  SLOT(device_info);
  SLOT(enable_peer_access);
  SLOT(peer_info);
  SLOT(measure_link);
  SLOT(copy_batch);
  SLOT(copy_plan_create);
  SLOT(copy_plan_execute);
  SLOT(copy_plan_destroy);
  SLOT(memory_allocate);
  SLOT(memory_free);
  SLOT(memory_to_host);
  SLOT(memory_from_host);
  SLOT(stream_synchronize);
  SLOT(broadcast);
  SLOT(reduce);
  SLOT(all_reduce);
  SLOT(comm_unique_id);
  SLOT(comm_create);
  SLOT(comm_destroy);
  SLOT(comm_all_reduce);
  SLOT(comm_broadcast);
  SLOT(comm_reduce);
  SLOT(all_reduce_plan_create);
  SLOT(all_reduce_plan_execute);
  SLOT(all_reduce_plan_destroy);
  SLOT(hessian_accumulate);
  SLOT(gptq_quantize);
  SLOT(signround_qdq);
  SLOT(signround_qdq_backward);
  SLOT(signsgd_step);
  SLOT(signround_experts_qdq);
  SLOT(signround_experts_qdq_backward);
  SLOT(signsgd_experts_step);
#undef SLOT

  std::vector<std::string> enums;
#define ENUM(value) enums.push_back(Quoted(#value) + ": " + std::to_string(static_cast<long long>(value)))
  ENUM(QLINK_ABI_MAJOR);
  ENUM(QLINK_ABI_MINOR);
  ENUM(kDLCPU);
  ENUM(kDLCUDA);
  ENUM(kDLROCM);
  ENUM(QLINK_OK);
  ENUM(QLINK_INVALID_ARGUMENT);
  ENUM(QLINK_UNAVAILABLE);
  ENUM(QLINK_VERSION_MISMATCH);
  ENUM(QLINK_OUT_OF_MEMORY);
  ENUM(QLINK_RUNTIME_ERROR);
  ENUM(QLINK_INTERNAL);
  ENUM(QLINK_PEER_NOT_APPLICABLE);
  ENUM(QLINK_PEER_NOT_REQUESTED);
  ENUM(QLINK_PEER_DISABLED);
  ENUM(QLINK_PEER_UNSUPPORTED);
  ENUM(QLINK_PEER_ENABLE_FAILED);
  ENUM(QLINK_PEER_PROBE_REJECTED);
  ENUM(QLINK_PEER_ENABLED);
  ENUM(QLINK_COPY_SOURCES_READY);
  ENUM(QLINK_COPY_SOURCES_HELD);
  ENUM(QLINK_COPY_WAIT);
  ENUM(QLINK_REDUCE_SUM);
  ENUM(QLINK_REDUCE_AVG);
  ENUM(QLINK_REDUCE_SIGN);
  ENUM(QLINK_TRANSPORT_FP32);
  ENUM(QLINK_TRANSPORT_BF16);
  ENUM(QLINK_ALL_REDUCE_AUTO);
  ENUM(QLINK_ALL_REDUCE_TWO_SHOT);
  ENUM(QLINK_ALL_REDUCE_HALVING_DOUBLING);
  ENUM(QLINK_HESSIAN_PRECISION_DEFAULT);
  ENUM(QLINK_HESSIAN_PRECISION_IEEE_FP32);
  ENUM(QLINK_HESSIAN_PRECISION_TENSOR);
  ENUM(QLINK_HESSIAN_PRECISION_TENSOR_GEMM);
  ENUM(QLINK_GPTQ_INVERSE_CHOLESKY_INVERSE);
  ENUM(QLINK_GPTQ_INVERSE_TRIANGULAR);
#undef ENUM

  auto join = [](const std::vector<std::string>& items) {
    std::string out;
    for (const std::string& item : items) out += (out.empty() ? "    " : ",\n    ") + item;
    return out;
  };
  std::printf("{\"structs\": {\n%s},\n \"slots\": [\n%s],\n \"enums\": {\n%s}}\n", s.Done().c_str(),
              join(slots).c_str(), join(enums).c_str());
  return 0;
}
