// Pins the ABI's layout, minor by minor (ONNX Runtime's way): every field's offset on LP64
// hosts, every older size a library still accepts, every function-table slot. A change
// that moves a released field fails the build here instead of failing hosts in the field.
// A new minor appends its fields and slots below; nothing above is ever edited.
#include <cstddef>
#include <cstdint>

#include "plugin_api/qlink.h"

#define QLINK_PIN(type, field, offset) \
  static_assert(offsetof(type, field) == (offset), #type "." #field " moved: released fields never move")
// Slot n of the function table, after struct_size and the two version words.
#define QLINK_SLOT(field, n)                                                                         \
  static_assert(offsetof(qlink_api, field) == offsetof(qlink_api, last_error) + (n) * sizeof(void*), \
                "qlink_api." #field " moved: the table is append-only")

#if UINTPTR_MAX == UINT64_MAX
// ---- 1.0 ------------------------------------------------------------------------------
QLINK_PIN(qlink_device_info, struct_size, 0);
QLINK_PIN(qlink_device_info, device, 8);
QLINK_PIN(qlink_device_info, name, 16);
QLINK_PIN(qlink_device_info, total_bytes, 144);
QLINK_PIN(qlink_device_info, free_bytes, 152);
static_assert(QLINK_DEVICE_INFO_STRUCT_SIZE_1_0 == 160, "qlink_device_info 1.0 size");

QLINK_PIN(qlink_peer_info, struct_size, 0);
QLINK_PIN(qlink_peer_info, src_device, 8);
QLINK_PIN(qlink_peer_info, dst_device, 12);
QLINK_PIN(qlink_peer_info, state, 16);
QLINK_PIN(qlink_peer_info, probed, 20);
QLINK_PIN(qlink_peer_info, peer_gbps, 24);
QLINK_PIN(qlink_peer_info, regular_gbps, 32);
QLINK_PIN(qlink_peer_info, reason, 40);
static_assert(QLINK_PEER_INFO_STRUCT_SIZE_1_0 == 296, "qlink_peer_info 1.0 size");

QLINK_PIN(qlink_link_measurement, struct_size, 0);
QLINK_PIN(qlink_link_measurement, bytes, 8);
QLINK_PIN(qlink_link_measurement, gbps, 16);
QLINK_PIN(qlink_link_measurement, latency_us, 24);
QLINK_PIN(qlink_link_measurement, used_peer, 32);
static_assert(QLINK_LINK_MEASUREMENT_STRUCT_SIZE_1_0 == 36, "qlink_link_measurement 1.0 size");

// Passed in arrays without a struct_size: frozen whole.
QLINK_PIN(qlink_stream, device, 0);
QLINK_PIN(qlink_stream, stream, 8);
static_assert(sizeof(qlink_stream) == 16, "qlink_stream is frozen");

QLINK_PIN(qlink_copy_args, struct_size, 0);
QLINK_PIN(qlink_copy_args, sources, 8);
QLINK_PIN(qlink_copy_args, destinations, 16);
QLINK_PIN(qlink_copy_args, num_leaves, 24);
QLINK_PIN(qlink_copy_args, streams, 32);
QLINK_PIN(qlink_copy_args, num_streams, 40);
static_assert(QLINK_COPY_ARGS_STRUCT_SIZE_1_0 == 48, "qlink_copy_args 1.0 size");

static_assert(offsetof(qlink_api, last_error) == 16, "qlink_api header");
QLINK_SLOT(last_error, 0);
QLINK_SLOT(context_create, 1);
QLINK_SLOT(context_destroy, 2);
QLINK_SLOT(backend_name, 3);
QLINK_SLOT(device_count, 4);
QLINK_SLOT(device_info, 5);
QLINK_SLOT(enable_peer_access, 6);
QLINK_SLOT(peer_info, 7);
QLINK_SLOT(measure_link, 8);
QLINK_SLOT(copy_batch, 9);
QLINK_SLOT(copy_plan_create, 10);
QLINK_SLOT(copy_plan_execute, 11);
QLINK_SLOT(copy_plan_destroy, 12);
QLINK_SLOT(memory_allocate, 13);
QLINK_SLOT(memory_free, 14);
QLINK_SLOT(memory_to_host, 15);
QLINK_SLOT(memory_from_host, 16);
QLINK_SLOT(stream_synchronize, 17);
static_assert(QLINK_API_STRUCT_SIZE_1_0 == 16 + 18 * 8, "qlink_api 1.0 size");

// ---- 1.1 ------------------------------------------------------------------------------
QLINK_PIN(qlink_broadcast_args, struct_size, 0);
QLINK_PIN(qlink_broadcast_args, sources, 8);
QLINK_PIN(qlink_broadcast_args, num_leaves, 16);
QLINK_PIN(qlink_broadcast_args, destinations, 24);
QLINK_PIN(qlink_broadcast_args, num_replicas, 32);
QLINK_PIN(qlink_broadcast_args, streams, 40);
QLINK_PIN(qlink_broadcast_args, num_streams, 48);
static_assert(QLINK_BROADCAST_ARGS_STRUCT_SIZE_1_1 == 56, "qlink_broadcast_args 1.1 size");

QLINK_PIN(qlink_reduce_args, struct_size, 0);
QLINK_PIN(qlink_reduce_args, inputs, 8);
QLINK_PIN(qlink_reduce_args, num_inputs, 16);
QLINK_PIN(qlink_reduce_args, output, 24);
QLINK_PIN(qlink_reduce_args, scale, 32);
QLINK_PIN(qlink_reduce_args, streams, 40);
QLINK_PIN(qlink_reduce_args, num_streams, 48);
static_assert(QLINK_REDUCE_ARGS_STRUCT_SIZE_1_1 == 56, "qlink_reduce_args 1.1 size");

QLINK_PIN(qlink_all_reduce_args, struct_size, 0);
QLINK_PIN(qlink_all_reduce_args, buffers, 8);
QLINK_PIN(qlink_all_reduce_args, num_buffers, 16);
QLINK_PIN(qlink_all_reduce_args, op, 24);
QLINK_PIN(qlink_all_reduce_args, transport, 28);
QLINK_PIN(qlink_all_reduce_args, streams, 32);
QLINK_PIN(qlink_all_reduce_args, num_streams, 40);
static_assert(QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE_1_1 == 48, "qlink_all_reduce_args 1.1 size");

static_assert(sizeof(qlink_unique_id) == 128, "qlink_unique_id is frozen");
QLINK_SLOT(broadcast, 18);
QLINK_SLOT(reduce, 19);
QLINK_SLOT(all_reduce, 20);
QLINK_SLOT(comm_unique_id, 21);
QLINK_SLOT(comm_create, 22);
QLINK_SLOT(comm_destroy, 23);
QLINK_SLOT(comm_all_reduce, 24);
QLINK_SLOT(comm_broadcast, 25);
QLINK_SLOT(comm_reduce, 26);
static_assert(QLINK_API_STRUCT_SIZE_1_1 == 16 + 27 * 8, "qlink_api 1.1 size");

// ---- 1.2 ------------------------------------------------------------------------------
QLINK_PIN(qlink_copy_args, flags, 48);
QLINK_PIN(qlink_broadcast_args, flags, 56);
QLINK_PIN(qlink_all_reduce_args, algorithm, 48);
QLINK_SLOT(all_reduce_plan_create, 27);
QLINK_SLOT(all_reduce_plan_execute, 28);
QLINK_SLOT(all_reduce_plan_destroy, 29);
static_assert(QLINK_API_STRUCT_SIZE_1_2 == 16 + 30 * 8, "qlink_api 1.2 size");

// ---- 1.3: a copy flag (QLINK_COPY_WAIT), no field or slot -------------------------------
static_assert(QLINK_COPY_WAIT == 4, "qlink_copy_flags values are frozen");
static_assert(QLINK_API_STRUCT_SIZE_1_3 == QLINK_API_STRUCT_SIZE_1_2, "qlink_api 1.3 size");

// ---- 1.4: GPTQ ---------------------------------------------------------------------------
QLINK_PIN(qlink_hessian_args, struct_size, 0);
QLINK_PIN(qlink_hessian_args, inputs, 8);
QLINK_PIN(qlink_hessian_args, num_inputs, 16);
QLINK_PIN(qlink_hessian_args, partials, 24);
QLINK_PIN(qlink_hessian_args, num_partials, 32);
QLINK_PIN(qlink_hessian_args, streams, 40);
QLINK_PIN(qlink_hessian_args, num_streams, 48);
static_assert(QLINK_HESSIAN_ARGS_STRUCT_SIZE_1_4 == 56, "qlink_hessian_args 1.4 size");

QLINK_PIN(qlink_gptq_options, struct_size, 0);
QLINK_PIN(qlink_gptq_options, bits, 8);
QLINK_PIN(qlink_gptq_options, group_size, 12);
QLINK_PIN(qlink_gptq_options, sym, 16);
QLINK_PIN(qlink_gptq_options, desc_act, 20);
QLINK_PIN(qlink_gptq_options, static_groups, 24);
QLINK_PIN(qlink_gptq_options, tf32, 28);
QLINK_PIN(qlink_gptq_options, damp, 32);
QLINK_PIN(qlink_gptq_options, damp_auto_increment, 40);
QLINK_PIN(qlink_gptq_options, nsamples, 48);
static_assert(QLINK_GPTQ_OPTIONS_STRUCT_SIZE_1_4 == 56, "qlink_gptq_options 1.4 size");

QLINK_PIN(qlink_gptq_layer, struct_size, 0);
QLINK_PIN(qlink_gptq_layer, name, 8);
QLINK_PIN(qlink_gptq_layer, weight, 16);
QLINK_PIN(qlink_gptq_layer, hessian, 24);
QLINK_PIN(qlink_gptq_layer, codes, 32);
QLINK_PIN(qlink_gptq_layer, scales, 40);
QLINK_PIN(qlink_gptq_layer, zeros, 48);
QLINK_PIN(qlink_gptq_layer, g_idx, 56);
QLINK_PIN(qlink_gptq_layer, dequantized, 64);
QLINK_PIN(qlink_gptq_layer, loss, 72);
QLINK_PIN(qlink_gptq_layer, damp, 80);
static_assert(QLINK_GPTQ_LAYER_STRUCT_SIZE_1_4 == 88, "qlink_gptq_layer 1.4 size");

QLINK_PIN(qlink_gptq_args, struct_size, 0);
QLINK_PIN(qlink_gptq_args, options, 8);
QLINK_PIN(qlink_gptq_args, layers, 16);
QLINK_PIN(qlink_gptq_args, num_layers, 24);
QLINK_PIN(qlink_gptq_args, devices, 32);
QLINK_PIN(qlink_gptq_args, num_devices, 40);
QLINK_PIN(qlink_gptq_args, streams, 48);
QLINK_PIN(qlink_gptq_args, num_streams, 56);
static_assert(QLINK_GPTQ_ARGS_STRUCT_SIZE_1_4 == 64, "qlink_gptq_args 1.4 size");

QLINK_SLOT(hessian_accumulate, 30);
QLINK_SLOT(gptq_quantize, 31);
static_assert(QLINK_API_STRUCT_SIZE_1_4 == 16 + 32 * 8, "qlink_api 1.4 size");

// ---- 1.5: GPTQ's group-aware reordering --------------------------------------------------
QLINK_PIN(qlink_gptq_options, act_group_aware, 56);
static_assert(QLINK_GPTQ_OPTIONS_STRUCT_SIZE_1_5 == 60, "qlink_gptq_options 1.5 size");
static_assert(QLINK_API_STRUCT_SIZE_1_5 == QLINK_API_STRUCT_SIZE_1_4, "qlink_api 1.5 size");

// ---- 1.6: the Hessian's precision ---------------------------------------------------------
QLINK_PIN(qlink_hessian_args, precision, 56);
static_assert(QLINK_HESSIAN_ARGS_STRUCT_SIZE_1_6 == 60, "qlink_hessian_args 1.6 size");
static_assert(QLINK_HESSIAN_PRECISION_DEFAULT == 0 && QLINK_HESSIAN_PRECISION_IEEE_FP32 == 1 &&
                  QLINK_HESSIAN_PRECISION_TENSOR == 2,
              "qlink_hessian_precision values are frozen");
static_assert(QLINK_API_STRUCT_SIZE_1_6 == QLINK_API_STRUCT_SIZE_1_5, "qlink_api 1.6 size");

// ---- 1.7: SignRound ----------------------------------------------------------------------
QLINK_PIN(qlink_signround_options, struct_size, 0);
QLINK_PIN(qlink_signround_options, bits, 8);
QLINK_PIN(qlink_signround_options, group_size, 12);
QLINK_PIN(qlink_signround_options, sym, 16);
QLINK_PIN(qlink_signround_options, scale_dtype, 20);
QLINK_PIN(qlink_signround_options, q_scale_thresh, 24);
static_assert(QLINK_SIGNROUND_OPTIONS_STRUCT_SIZE_1_7 == 32, "qlink_signround_options 1.7 size");

QLINK_PIN(qlink_signround_layer, struct_size, 0);
QLINK_PIN(qlink_signround_layer, name, 8);
QLINK_PIN(qlink_signround_layer, weight, 16);
QLINK_PIN(qlink_signround_layer, v, 24);
QLINK_PIN(qlink_signround_layer, min_scale, 32);
QLINK_PIN(qlink_signround_layer, max_scale, 40);
QLINK_PIN(qlink_signround_layer, qdq, 48);
QLINK_PIN(qlink_signround_layer, grad_qdq, 56);
QLINK_PIN(qlink_signround_layer, grad_v, 64);
QLINK_PIN(qlink_signround_layer, grad_min_scale, 72);
QLINK_PIN(qlink_signround_layer, grad_max_scale, 80);
static_assert(QLINK_SIGNROUND_LAYER_STRUCT_SIZE_1_7 == 88, "qlink_signround_layer 1.7 size");

QLINK_PIN(qlink_signround_args, struct_size, 0);
QLINK_PIN(qlink_signround_args, options, 8);
QLINK_PIN(qlink_signround_args, layers, 16);
QLINK_PIN(qlink_signround_args, num_layers, 24);
QLINK_PIN(qlink_signround_args, streams, 32);
QLINK_PIN(qlink_signround_args, num_streams, 40);
static_assert(QLINK_SIGNROUND_ARGS_STRUCT_SIZE_1_7 == 48, "qlink_signround_args 1.7 size");

QLINK_PIN(qlink_signsgd_param, struct_size, 0);
QLINK_PIN(qlink_signsgd_param, param, 8);
QLINK_PIN(qlink_signsgd_param, grad, 16);
QLINK_PIN(qlink_signsgd_param, best, 24);
QLINK_PIN(qlink_signsgd_param, lr_group, 32);
static_assert(QLINK_SIGNSGD_PARAM_STRUCT_SIZE_1_7 == 36, "qlink_signsgd_param 1.7 size");

QLINK_PIN(qlink_signsgd_args, struct_size, 0);
QLINK_PIN(qlink_signsgd_args, params, 8);
QLINK_PIN(qlink_signsgd_args, num_params, 16);
QLINK_PIN(qlink_signsgd_args, lrs, 24);
QLINK_PIN(qlink_signsgd_args, epoch, 32);
QLINK_PIN(qlink_signsgd_args, total_iters, 40);
QLINK_PIN(qlink_signsgd_args, loss, 48);
QLINK_PIN(qlink_signsgd_args, best_loss, 56);
QLINK_PIN(qlink_signsgd_args, streams, 64);
QLINK_PIN(qlink_signsgd_args, num_streams, 72);
static_assert(QLINK_SIGNSGD_ARGS_STRUCT_SIZE_1_7 == 80, "qlink_signsgd_args 1.7 size");

QLINK_SLOT(signround_qdq, 32);
QLINK_SLOT(signround_qdq_backward, 33);
QLINK_SLOT(signsgd_step, 34);
static_assert(QLINK_API_STRUCT_SIZE_1_7 == 16 + 35 * 8, "qlink_api 1.7 size");

// ---- 1.8: a partial named per input --------------------------------------------------------
QLINK_PIN(qlink_hessian_args, input_partials, 64);
static_assert(QLINK_HESSIAN_ARGS_STRUCT_SIZE_1_8 == 72, "qlink_hessian_args 1.8 size");
static_assert(QLINK_API_STRUCT_SIZE_1_8 == QLINK_API_STRUCT_SIZE_1_7, "qlink_api 1.8 size");

// ---- 1.9: SignSGD's step of v inside the backward ------------------------------------------
QLINK_PIN(qlink_signround_layer, best_v, 88);
QLINK_PIN(qlink_signround_layer, lr_group, 96);
static_assert(QLINK_SIGNROUND_LAYER_STRUCT_SIZE_1_9 == 100, "qlink_signround_layer 1.9 size");
QLINK_PIN(qlink_signround_args, step_lrs, 48);
QLINK_PIN(qlink_signround_args, loss, 56);
QLINK_PIN(qlink_signround_args, best_loss, 64);
static_assert(QLINK_SIGNROUND_ARGS_STRUCT_SIZE_1_9 == 72, "qlink_signround_args 1.9 size");
static_assert(QLINK_API_STRUCT_SIZE_1_9 == QLINK_API_STRUCT_SIZE_1_8, "qlink_api 1.9 size");

// ---- 1.10: a block's experts -----------------------------------------------------------------
QLINK_PIN(qlink_signround_experts_args, struct_size, 0);
QLINK_PIN(qlink_signround_experts_args, layers, 8);
QLINK_PIN(qlink_signround_experts_args, tokens, 16);
static_assert(QLINK_SIGNROUND_EXPERTS_ARGS_STRUCT_SIZE_1_10 == 24, "qlink_signround_experts_args 1.10 size");
QLINK_PIN(qlink_signsgd_experts_args, struct_size, 0);
QLINK_PIN(qlink_signsgd_experts_args, step, 8);
QLINK_PIN(qlink_signsgd_experts_args, num_experts, 16);
QLINK_PIN(qlink_signsgd_experts_args, tokens, 24);
static_assert(QLINK_SIGNSGD_EXPERTS_ARGS_STRUCT_SIZE_1_10 == 32, "qlink_signsgd_experts_args 1.10 size");
QLINK_SLOT(signround_experts_qdq, 35);
QLINK_SLOT(signround_experts_qdq_backward, 36);
QLINK_SLOT(signsgd_experts_step, 37);
static_assert(QLINK_API_STRUCT_SIZE_1_10 == 16 + 38 * 8, "qlink_api 1.10 size");

// ---- 1.11: GPTQ's inverse ------------------------------------------------------------------
QLINK_PIN(qlink_gptq_options, inverse, 60);
static_assert(QLINK_GPTQ_OPTIONS_STRUCT_SIZE_1_11 == 64, "qlink_gptq_options 1.11 size");
static_assert(QLINK_GPTQ_INVERSE_CHOLESKY_INVERSE == 0 && QLINK_GPTQ_INVERSE_TRIANGULAR == 1,
              "qlink_gptq_inverse values are frozen");
static_assert(QLINK_HESSIAN_PRECISION_TENSOR_GEMM == 3, "qlink_hessian_precision 1.11 value");
static_assert(QLINK_API_STRUCT_SIZE_1_11 == QLINK_API_STRUCT_SIZE_1_10, "qlink_api 1.11 size");
#endif

// Every current *_STRUCT_SIZE covers its struct's last field, on every platform.
static_assert(QLINK_COPY_ARGS_STRUCT_SIZE == offsetof(qlink_copy_args, flags) + sizeof(uint32_t), "copy args");
static_assert(QLINK_BROADCAST_ARGS_STRUCT_SIZE == offsetof(qlink_broadcast_args, flags) + sizeof(uint32_t), "bcast");
static_assert(QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE == offsetof(qlink_all_reduce_args, algorithm) + sizeof(int32_t),
              "all-reduce args");
static_assert(QLINK_GPTQ_OPTIONS_STRUCT_SIZE == offsetof(qlink_gptq_options, inverse) + sizeof(int32_t),
              "gptq options");
static_assert(QLINK_HESSIAN_ARGS_STRUCT_SIZE == offsetof(qlink_hessian_args, input_partials) + sizeof(void*),
              "hessian args");
static_assert(QLINK_SIGNROUND_LAYER_STRUCT_SIZE == offsetof(qlink_signround_layer, lr_group) + sizeof(int32_t),
              "signround layer");
static_assert(QLINK_SIGNROUND_ARGS_STRUCT_SIZE == offsetof(qlink_signround_args, best_loss) + sizeof(void*),
              "signround args");
static_assert(QLINK_API_STRUCT_SIZE == sizeof(qlink_api), "the table's size macro covers every slot");
