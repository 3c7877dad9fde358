/* qlink: a multi-GPU runtime for LLM quantization, as one stable C ABI.
 *
 * This is the only public header. It is C99 and depends on DLPack alone.
 *
 * A host loads libqlink.so with dlopen, looks up the one exported symbol
 * qlink_get_api, and calls everything else through the function table it returns.
 *
 * Conventions (PJRT / NCCL style):
 *  - Every table and every struct that crosses the ABI starts with `size_t struct_size`.
 *    A caller sets it to the size it was compiled with (the *_STRUCT_SIZE macros);
 *    qlink reads or writes no byte past it. Fields are only ever appended.
 *  - The function table is append-only within a major version: a host built against
 *    minor M keeps working with any library of the same major and minor >= M.
 *  - Every call returns a qlink_status. On failure, last_error() gives a message for the
 *    calling thread that names the offending argument (which tensor, which field).
 *  - A call that fails with QLINK_INVALID_ARGUMENT has changed nothing: no destination
 *    of a refused batch is written.
 *  - Every call may be made from many threads at once, except that a handle must not be
 *    destroyed while another thread still uses it.
 *  - Pointer parameters say whether they are borrowed (qlink keeps no reference after the
 *    call returns) or owned (who frees them, and with what).
 *  - Tensors are DLPack DLTensors; the host owns their memory. Streams are opaque
 *    vendor handles (cudaStream_t, hipStream_t) bound to a device; NULL is the device's
 *    default stream. */
#ifndef QLINK_H_
#define QLINK_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QLINK_ABI_MAJOR 1
#define QLINK_ABI_MINOR 11

/* Size of a struct up to and including `last_field`: what a host built against the
 * minor that introduced `last_field` passes as struct_size.
 *
 * Each struct's *_STRUCT_SIZE macro covers the struct as this header declares it (its
 * last field); *_STRUCT_SIZE_<major>_<minor> names the size of an older layout, the
 * smallest a library accepts. A host sets struct_size from *_STRUCT_SIZE; qlink reads a
 * field only when struct_size covers it. plugin_api/layout_pins.cc pins every field's
 * offset per minor. */
#define QLINK_STRUCT_SIZE(type, last_field) (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

typedef enum qlink_status {
  QLINK_OK = 0,
  QLINK_INVALID_ARGUMENT = 1, /* an argument, config field or tensor was refused */
  QLINK_UNAVAILABLE = 2,      /* backend, device or peer path cannot serve the call */
  QLINK_VERSION_MISMATCH = 3, /* ABI major or minor not provided by this library */
  QLINK_OUT_OF_MEMORY = 4,
  QLINK_RUNTIME_ERROR = 5, /* the device runtime failed; its sticky error was drained */
  QLINK_INTERNAL = 6       /* a bug in qlink */
} qlink_status;

/* Opaque handles. */
typedef struct qlink_context qlink_context;
typedef struct qlink_copy_plan qlink_copy_plan;
typedef struct qlink_comm qlink_comm;                       /* 1.1: one rank of a multi-process communicator */
typedef struct qlink_all_reduce_plan qlink_all_reduce_plan; /* 1.2 */

typedef struct qlink_device_info {
  size_t struct_size;
  DLDevice device;
  char name[128];       /* NUL-terminated, e.g. "NVIDIA H200" or "cpu:virtual:2" */
  uint64_t total_bytes; /* device memory */
  uint64_t free_bytes;  /* at the time of the call */
} qlink_device_info;
#define QLINK_DEVICE_INFO_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_device_info, free_bytes)
#define QLINK_DEVICE_INFO_STRUCT_SIZE_1_0 QLINK_DEVICE_INFO_STRUCT_SIZE

/* How one ordered pair (src -> dst: dst reads or receives src's memory) is served. */
typedef enum qlink_peer_state {
  QLINK_PEER_NOT_APPLICABLE = 0, /* same device, or a backend without peer access (CPU) */
  QLINK_PEER_NOT_REQUESTED = 1,  /* enable_peer_access has not covered this pair yet */
  QLINK_PEER_DISABLED = 2,       /* config p2p.mode is "off" */
  QLINK_PEER_UNSUPPORTED = 3,    /* the runtime reports no peer capability */
  QLINK_PEER_ENABLE_FAILED = 4,  /* capable, but enabling failed */
  QLINK_PEER_PROBE_REJECTED = 5, /* enabled, but the probe missed min_gbps or min_ratio */
  QLINK_PEER_ENABLED = 6         /* copies may take the direct peer path */
} qlink_peer_state;

typedef struct qlink_peer_info {
  size_t struct_size;
  int32_t src_device;
  int32_t dst_device;
  int32_t state;       /* qlink_peer_state */
  int32_t probed;      /* 1 when the gbps fields below were measured */
  double peer_gbps;    /* probe over the peer path (1e9 bytes/s) */
  double regular_gbps; /* probe over the regular (host-staged) path */
  char reason[256];    /* NUL-terminated; why the pair is not enabled, else empty */
} qlink_peer_info;
#define QLINK_PEER_INFO_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_peer_info, reason)
#define QLINK_PEER_INFO_STRUCT_SIZE_1_0 QLINK_PEER_INFO_STRUCT_SIZE

/* A measured link, as reported by measure_link (what `qlink probe` prints). */
typedef struct qlink_link_measurement {
  size_t struct_size;
  uint64_t bytes;    /* bytes per timed copy */
  double gbps;       /* bandwidth of a `bytes` copy */
  double latency_us; /* one small (4 KiB) copy, enqueue to completion */
  int32_t used_peer; /* 1 when the direct peer path carried it */
} qlink_link_measurement;
#define QLINK_LINK_MEASUREMENT_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_link_measurement, used_peer)
#define QLINK_LINK_MEASUREMENT_STRUCT_SIZE_1_0 QLINK_LINK_MEASUREMENT_STRUCT_SIZE

/* The stream to order a device's part of a call against. */
typedef struct qlink_stream {
  DLDevice device;
  void* stream; /* borrowed vendor stream handle; NULL = the device's default stream */
} qlink_stream;

/* A batch of leaves: sources[i] is copied into destinations[i].
 *
 * Every leaf must be contiguous (strides NULL or compact row-major) with equal byte
 * sizes on both sides; dtypes may differ (bytes are copied, not converted).
 * Destinations must not overlap each other or any source.
 *
 * Ordering: for each device pair, work already enqueued on the source device's stream
 * completes before the leaf is read; the copy is enqueued on the destination device's
 * stream, so anything enqueued there afterwards sees it; and work enqueued afterwards on
 * the source device's stream waits until the leaf has been read, so sources may be
 * overwritten or freed in stream order as soon as the call returns (as with PyTorch's
 * own cross-device copy_). The call does not block the host unless asked to
 * (QLINK_COPY_WAIT). qlink_copy_args.flags (1.2) hands either join to a host that orders
 * the work itself. */
typedef struct qlink_copy_args {
  size_t struct_size;
  const DLTensor* sources;      /* borrowed array of num_leaves */
  const DLTensor* destinations; /* borrowed array of num_leaves */
  size_t num_leaves;
  const qlink_stream* streams; /* borrowed array of num_streams; may be NULL */
  size_t num_streams;          /* devices not listed use their default stream */
  uint32_t flags;              /* 1.2: qlink_copy_flags, or-ed; read only when
                                  struct_size covers it, else 0 */
} qlink_copy_args;
#define QLINK_COPY_ARGS_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_copy_args, flags)
#define QLINK_COPY_ARGS_STRUCT_SIZE_1_0 QLINK_STRUCT_SIZE(qlink_copy_args, num_streams)

/* 1.2: promises by which a host takes over part of a copy's ordering. Each saves a
 * cross-device event join (a few microseconds of enqueue, and of waiting on the GPU). */
typedef enum qlink_copy_flags {
  /* Whatever produced the sources is already ordered before the destination streams
   * (the host synchronized, or joined the streams itself): no wait on the source streams. */
  QLINK_COPY_SOURCES_READY = 1,
  /* The host keeps every source alive and unmodified until the copy has completed on the
   * destination stream (a prepared plan over frozen weights, say): later work on the
   * source streams does not wait for the copy. */
  QLINK_COPY_SOURCES_HELD = 2,
  /* 1.3: the call returns once the copy has completed on every destination stream, as a
   * blocking cudaMemcpy does: one call where a host would enqueue, then synchronize. */
  QLINK_COPY_WAIT = 4
} qlink_copy_flags;

/* ---- 1.1: collectives over one buffer per device, in process ---------------------- */

typedef enum qlink_reduce_op {
  QLINK_REDUCE_SUM = 0,
  QLINK_REDUCE_AVG = 1, /* sum / number of buffers */
  QLINK_REDUCE_SIGN = 2 /* sign(sum) in {-1, 0, 1}: SignSGD's update, bit-identical everywhere */
} qlink_reduce_op;

typedef enum qlink_transport {
  QLINK_TRANSPORT_FP32 = 0,
  QLINK_TRANSPORT_BF16 = 1 /* partials cross links as bf16 (half the bytes); sums stay fp32 */
} qlink_transport;

/* Mirrors a module's leaves from one device to replicas on other devices, relayed along
 * a binary tree of peer links so the source's link is not the bottleneck. Every leaf
 * follows the rules of qlink_copy_args. */
typedef struct qlink_broadcast_args {
  size_t struct_size;
  const DLTensor* sources; /* borrowed array of num_leaves, all on one device */
  size_t num_leaves;
  const DLTensor* destinations; /* borrowed array of num_replicas * num_leaves, replica-major:
                                   destinations[r * num_leaves + i] receives sources[i] */
  size_t num_replicas;          /* each replica on its own device, not the source's */
  const qlink_stream* streams;  /* borrowed array of num_streams; may be NULL */
  size_t num_streams;
  uint32_t flags; /* 1.2: qlink_copy_flags for the root's sources (relays from
                     replicas keep their joins; QLINK_COPY_WAIT waits for
                     every replica); read only when struct_size covers it,
                     else 0 */
} qlink_broadcast_args;
#define QLINK_BROADCAST_ARGS_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_broadcast_args, flags)
#define QLINK_BROADCAST_ARGS_STRUCT_SIZE_1_1 QLINK_STRUCT_SIZE(qlink_broadcast_args, num_streams)

/* output = scale * sum of inputs, summed in device-index order whatever order the
 * inputs are listed in, so the result is bit-identical for every arrival order (GPTQ's
 * Hessian partials: scale = 2 / total rows). One kernel on the output's device reads
 * the partials straight from peer memory. */
typedef struct qlink_reduce_args {
  size_t struct_size;
  const DLTensor* inputs; /* borrowed array of num_inputs; fp32, equal shapes,
                             one per device */
  size_t num_inputs;
  const DLTensor* output; /* borrowed; fp32, the inputs' shape; may be the input
                             of its own device */
  double scale;
  const qlink_stream* streams; /* borrowed array of num_streams; may be NULL */
  size_t num_streams;
} qlink_reduce_args;
#define QLINK_REDUCE_ARGS_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_reduce_args, num_streams)
#define QLINK_REDUCE_ARGS_STRUCT_SIZE_1_1 QLINK_REDUCE_ARGS_STRUCT_SIZE

typedef enum qlink_all_reduce_algorithm {
  QLINK_ALL_REDUCE_AUTO = 0,            /* one-shot up to 1 MiB where every pair has peer
                                           access, else two-shot */
  QLINK_ALL_REDUCE_TWO_SHOT = 1,        /* reduce-scatter by chunk owners, then all-gather */
  QLINK_ALL_REDUCE_HALVING_DOUBLING = 2 /* recursive halving, then doubling: power-of-two
                                           buffer counts, fp32 transport */
} qlink_all_reduce_algorithm;

/* Every buffer becomes op(sum of all buffers), in place, and all end bit-identical: each
 * element is summed by one owner and then gathered. Two-shot: each device owns one chunk
 * and sums that chunk of every buffer in device-index order (reading peers directly); with
 * QLINK_REDUCE_SIGN the gathered chunks are int8 signs. */
typedef struct qlink_all_reduce_args {
  size_t struct_size;
  const DLTensor* buffers; /* borrowed array of num_buffers; fp32, equal shapes,
                              one per device */
  size_t num_buffers;
  int32_t op;                  /* qlink_reduce_op */
  int32_t transport;           /* qlink_transport */
  const qlink_stream* streams; /* borrowed array of num_streams; may be NULL */
  size_t num_streams;
  int32_t algorithm; /* 1.2: qlink_all_reduce_algorithm; read only when
                        struct_size covers it, else QLINK_ALL_REDUCE_AUTO.
                        (Appended while the minor was still 1.1: a host that
                        sets it asks for minor 1.2 or later.) */
} qlink_all_reduce_args;
#define QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_all_reduce_args, algorithm)
#define QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE_1_1 QLINK_STRUCT_SIZE(qlink_all_reduce_args, num_streams)

/* ---- 1.1: collectives across processes and nodes (NCCL; RCCL on HIP) -------------- */

/* Created by one rank, handed to every other rank by the host (e.g. through
 * torch.distributed's store), then passed to comm_create on each. */
typedef struct qlink_unique_id {
  char bytes[128];
} qlink_unique_id;

/* ---- 1.4: GPTQ (the quant/ engine) ------------------------------------------------- */

/* 1.6: how a Hessian's products are summed (qlink_hessian_args.precision; config field
 * hessian_precision, "ieee_fp32" unless set). fp32 activations always take IEEE fp32. */
typedef enum qlink_hessian_precision {
  QLINK_HESSIAN_PRECISION_DEFAULT = 0,   /* the context's config hessian_precision */
  QLINK_HESSIAN_PRECISION_IEEE_FP32 = 1, /* bf16/fp16 activations converted to fp32, IEEE
                                            fp32 products and sums */
  QLINK_HESSIAN_PRECISION_TENSOR = 2,    /* bf16/fp16 activations read as they are by the
                                            tensor cores (exact products). CUDA: qlink's
                                            kernel, every 32 rows' sum promoted out of the
                                            tensor cores into fp32 registers by IEEE adds.
                                            HIP (and CUDA for columns not a multiple of 8
                                            or an input not 16-byte aligned): GemmEx, 2048
                                            rows at a time, each block's sum added to the
                                            partial in fp32. Faster; on a backend without
                                            tensor cores (CPU) the IEEE fp32 result */
  /* 1.11 */
  QLINK_HESSIAN_PRECISION_TENSOR_GEMM = 3 /* as TENSOR, but on CUDA too the vendor's GemmEx,
                                             2048 rows a call (each call's sum added to the
                                             partial in fp32): faster than qlink's kernel,
                                             its sums longer below IEEE fp32 */
} qlink_hessian_precision;

/* Hessian partials of calibration activations: partials[d] += X^T X (fp32, summed as
 * `precision` says) for every input X on device d, enqueued on that device's stream like a
 * copy (the call does not block). X^T X is a symmetric rank-k update; the partial is written whole (both
 * triangles). A host merges one partial per device with `reduce` (device-index order,
 * scale = 2 / total rows): GPTQ's H = (2/N) sum_d H_d, bit-identical for every arrival
 * order. 1.8: with input_partials, each input names its partial instead, so one call
 * updates many partials of one device (the experts of an MoE layer, each from its own
 * routed rows); the inputs of one partial are added in the order given. */
typedef struct qlink_hessian_args {
  size_t struct_size;
  const DLTensor* inputs; /* borrowed array of num_inputs: activations (..., columns),
                             fp32, bf16 or fp16, contiguous; the rows are every
                             leading index */
  size_t num_inputs;
  const DLTensor* partials; /* borrowed array of num_partials: (columns, columns) fp32,
                               contiguous, at most one per device; each input's device
                               has one */
  size_t num_partials;
  const qlink_stream* streams; /* borrowed array of num_streams; may be NULL */
  size_t num_streams;
  /* 1.6 */
  int32_t precision; /* qlink_hessian_precision; DEFAULT (0) where struct_size
                        ends before it */
  /* 1.8 */
  const int32_t* input_partials; /* borrowed array of num_inputs, or NULL: the index in
                                    partials of each input's partial, on the input's
                                    device with its columns; any number of partials per
                                    device. NULL (or struct_size ending before it): the
                                    partial on the input's device, one per device */
} qlink_hessian_args;
#define QLINK_HESSIAN_ARGS_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_hessian_args, input_partials)
#define QLINK_HESSIAN_ARGS_STRUCT_SIZE_1_4 QLINK_STRUCT_SIZE(qlink_hessian_args, num_streams)
#define QLINK_HESSIAN_ARGS_STRUCT_SIZE_1_6 QLINK_STRUCT_SIZE(qlink_hessian_args, precision)
#define QLINK_HESSIAN_ARGS_STRUCT_SIZE_1_8 QLINK_HESSIAN_ARGS_STRUCT_SIZE

/* 1.11: how GPTQ's inverse factor U (H^-1 = U^T U, U upper) is made
 * (qlink_gptq_options.inverse). Both give U to fp32 rounding; they differ in the last bits. */
typedef enum qlink_gptq_inverse {
  QLINK_GPTQ_INVERSE_CHOLESKY_INVERSE = 0, /* PyTorch's calls as GPTQModel makes them:
                                              potrf(H), cholesky_inverse, potrf(H^-1, upper):
                                              GPTQModel's U to the last bit where the
                                              libraries allow; about 8/3 n^3 flops */
  QLINK_GPTQ_INVERSE_TRIANGULAR = 1        /* the Cholesky factor of H with its columns in
                                              reverse order, then its triangular inverse
                                              (J L^-1 J = U for J H J = L L^T, J the
                                              exchange): 2/3 n^3 flops, no explicit H^-1 */
} qlink_gptq_inverse;

/* GPTQ as GPTQModel's GPTQ.quantize runs it: the damped Hessian inverted through
 * Cholesky factors (the damp raised by damp_auto_increment after each failed Cholesky
 * while below 1), dead columns (zero diagonal) zeroed, columns quantized in blocks of 128
 * with each column's error spread over the columns after it, IEEE fp32 throughout unless
 * tf32 is set. Min-max ranges per group of columns: the whole row (group_size -1), else
 * taken from the weight as it stands when the group's block starts, or from the weight
 * before any update (static_groups). */
typedef struct qlink_gptq_options {
  size_t struct_size;
  int32_t bits;               /* 2, 3, 4 or 8 */
  int32_t group_size;         /* -1 (one group per row) or a positive divisor of the columns */
  int32_t sym;                /* nonzero: symmetric ranges, zero = 2^(bits-1) */
  int32_t desc_act;           /* nonzero: columns in descending order of the Hessian's
                                 diagonal (act-order); g_idx gives each column's group */
  int32_t static_groups;      /* nonzero: group ranges from the unupdated weight */
  int32_t tf32;               /* nonzero: cross-block updates may use TF32 tensor cores;
                                 0 (the default) keeps IEEE fp32 */
  double damp;                /* fraction of the mean diagonal added to the diagonal, (0, 1) */
  double damp_auto_increment; /* added to damp after a failed Cholesky, [0, 1); 0: no retry */
  double nsamples;            /* calibration rows behind the Hessian: loss = sum of
                                 (w - q)^2 / d^2 / 2 over the layer, divided by nsamples;
                                 0 leaves the sum undivided */
  /* 1.5 */
  int32_t act_group_aware; /* nonzero: GPTQModel's group-aware reordering (GAR): columns
                              visited group by group, groups in descending order of their
                              largest diagonal entry of the Hessian, columns within a
                              group in descending order of theirs. Needs a group_size;
                              excludes desc_act and static_groups. Each column keeps its
                              group (g_idx = column / group_size). 0 where struct_size
                              ends before it */
  /* 1.11 */
  int32_t inverse; /* qlink_gptq_inverse; CHOLESKY_INVERSE (0) where struct_size ends
                      before it */
} qlink_gptq_options;
#define QLINK_GPTQ_OPTIONS_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_gptq_options, inverse)
#define QLINK_GPTQ_OPTIONS_STRUCT_SIZE_1_4 QLINK_STRUCT_SIZE(qlink_gptq_options, nsamples)
#define QLINK_GPTQ_OPTIONS_STRUCT_SIZE_1_5 QLINK_STRUCT_SIZE(qlink_gptq_options, act_group_aware)
#define QLINK_GPTQ_OPTIONS_STRUCT_SIZE_1_11 QLINK_GPTQ_OPTIONS_STRUCT_SIZE

/* One linear layer to quantize. Inputs are read only; every output is optional (NULL: not
 * wanted) and lives on the weight's device. */
typedef struct qlink_gptq_layer {
  size_t struct_size;
  const char* name;            /* borrowed, NUL-terminated; names the layer in refusals and
                                  logs; NULL: "layers[i]" */
  const DLTensor* weight;      /* borrowed; (rows, columns) fp32, bf16 or fp16, contiguous */
  const DLTensor* hessian;     /* borrowed; (columns, columns) fp32, contiguous, on the
                                  weight's device. Layers given the same Hessian (same
                                  data, offset and device: q/k/v, gate/up) share one inverse,
                                  computed once */
  const DLTensor* codes;       /* borrowed; (rows, columns) uint8 levels in [0, 2^bits) */
  const DLTensor* scales;      /* borrowed; (rows, groups) fp32; groups = columns / group_size
                                  (1 for -1), in the order the columns were visited (under
                                  act_group_aware: in the groups' own order) */
  const DLTensor* zeros;       /* borrowed; (rows, groups) fp32 holding integers */
  const DLTensor* g_idx;       /* borrowed; (columns) int32: each column's group */
  const DLTensor* dequantized; /* borrowed; (rows, columns) fp32, bf16 or fp16:
                                  scale * (code - zero); may be `weight` itself */
  double loss;                 /* out: see qlink_gptq_options.nsamples */
  double damp;                 /* out: the damp the Cholesky succeeded with */
} qlink_gptq_layer;
#define QLINK_GPTQ_LAYER_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_gptq_layer, damp)
#define QLINK_GPTQ_LAYER_STRUCT_SIZE_1_4 QLINK_GPTQ_LAYER_STRUCT_SIZE

/* Quantizes layers, data-parallel over `devices`: each Hessian's inverse is computed once,
 * layers are placed by cost (a Hessian's layers together where that balances), and a
 * large layer's rows are split when devices outnumber layers. Results do not depend on
 * the devices used. Work already on the streams of the layers' devices completes before
 * any input is read; the call returns once every output holds its result. Every argument
 * and every inverse is checked before any output is written: a refused call (a Hessian
 * that stays indefinite up to the largest damp included, named with the damps tried)
 * writes nothing. */
typedef struct qlink_gptq_args {
  size_t struct_size;
  const qlink_gptq_options* options; /* borrowed */
  qlink_gptq_layer* layers;          /* borrowed array of num_layers; loss and damp written */
  size_t num_layers;
  const int32_t* devices; /* borrowed array of num_devices, each listed once; NULL
                             with 0: every layer on its weight's device */
  size_t num_devices;
  const qlink_stream* streams; /* borrowed array of num_streams; may be NULL */
  size_t num_streams;
} qlink_gptq_args;
#define QLINK_GPTQ_ARGS_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_gptq_args, num_streams)
#define QLINK_GPTQ_ARGS_STRUCT_SIZE_1_4 QLINK_GPTQ_ARGS_STRUCT_SIZE

/* 1.7. SignRound as AutoRound tunes a block: the quant-dequant of its WrapperLinear
 * (quant_tensor_sym / quant_tensor_asym with rounding offsets v and range factors
 * min_scale / max_scale), the gradients autograd takes through it (round as a
 * straight-through estimator), and its SignSGD step. The forward is AutoRound's
 * arithmetic operation for operation, rounded as PyTorch rounds on the device's kind (a
 * division by a Python number: true division on the CPU, a product with the reciprocal
 * on GPUs); the backward's per-group sums run in a fixed order of their own. */
typedef struct qlink_signround_options {
  size_t struct_size;
  int32_t bits;           /* 2, 3, 4 or 8 */
  int32_t group_size;     /* -1 (one group per row) or a positive divisor of the columns */
  int32_t sym;            /* nonzero: quant_tensor_sym (levels -2^(bits-1) .. 2^(bits-1) - 1);
                             zero: quant_tensor_asym (levels 0 .. 2^bits - 1, a zero point) */
  DLDataType scale_dtype; /* float16 (AutoRound's default), bfloat16 or float32 */
  double q_scale_thresh;  /* > 0: the scale's smallest magnitude (AutoRound: 1e-5, 1e-8
                             for a float32 scale) */
} qlink_signround_options;
#define QLINK_SIGNROUND_OPTIONS_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_signround_options, q_scale_thresh)
#define QLINK_SIGNROUND_OPTIONS_STRUCT_SIZE_1_7 QLINK_SIGNROUND_OPTIONS_STRUCT_SIZE

/* One wrapped linear; every tensor borrowed, contiguous, on the weight's device. groups =
 * rows * columns / group_len, group_len = group_size (columns for -1). */
typedef struct qlink_signround_layer {
  size_t struct_size;
  const char* name;               /* borrowed, NUL-terminated; names the layer in refusals;
                                     NULL: "layers[i]" */
  const DLTensor* weight;         /* (rows, columns) fp32, bf16 or fp16; read only */
  const DLTensor* v;              /* (groups, group_len) fp32: the rounding offsets; updated in
                                     place by a backward with args->step_lrs (1.9) */
  const DLTensor* min_scale;      /* (groups,) fp32; the forward clamps it to [0, 1] in place,
                                     as WrapperLinear does */
  const DLTensor* max_scale;      /* (groups,) fp32; likewise */
  const DLTensor* qdq;            /* forward's output: (rows, columns), the weight's dtype */
  const DLTensor* grad_qdq;       /* backward's input: (rows, columns), the weight's dtype */
  const DLTensor* grad_v;         /* backward's output: like v; NULL with args->step_lrs */
  const DLTensor* grad_min_scale; /* backward's outputs: like min_scale; NULL: not wanted */
  const DLTensor* grad_max_scale;
  /* 1.9, a backward with args->step_lrs. best_v (like v): v is copied here before its step
   * when *args->loss < *args->best_loss; NULL: not kept. lr_group: v's learning rate,
   * element lr_group of args->step_lrs. */
  const DLTensor* best_v;
  int32_t lr_group;
} qlink_signround_layer;
#define QLINK_SIGNROUND_LAYER_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_signround_layer, lr_group)
#define QLINK_SIGNROUND_LAYER_STRUCT_SIZE_1_7 QLINK_STRUCT_SIZE(qlink_signround_layer, grad_max_scale)
#define QLINK_SIGNROUND_LAYER_STRUCT_SIZE_1_9 QLINK_SIGNROUND_LAYER_STRUCT_SIZE

/* Every layer's forward (signround_qdq: weight, v, min_scale, max_scale, qdq) or backward
 * (signround_qdq_backward: the same inputs, grad_qdq, grad_v and the optional scale
 * gradients; qdq is not read). Stream-ordered like a copy: enqueued on each layer's device
 * stream (streams as in qlink_copy_args), returning without waiting, so a host may capture
 * it in a graph. Every argument is checked before anything is enqueued. */
typedef struct qlink_signround_args {
  size_t struct_size;
  const qlink_signround_options* options; /* borrowed */
  const qlink_signround_layer* layers;    /* borrowed array of num_layers */
  size_t num_layers;
  const qlink_stream* streams; /* borrowed array of num_streams; may be NULL */
  size_t num_streams;
  /* 1.9, signround_qdq_backward only (NULL, or a struct ending before them: grad_v written).
   * Non-NULL step_lrs: every layer's v takes SignSGD's step in place as the gradient is made
   * (v -= lr * sign(grad_v), lr = step_lrs[layers[i].lr_group]; grad_v never stored, so
   * layers[i].grad_v must be NULL), in one pass instead of a backward writing grad_v and a
   * signsgd_step reading it. With loss and best_loss each v is first copied to its best_v
   * when loss < best_loss; best_loss is read, not lowered: a signsgd_step of the range
   * factors with the same loss, after, lowers it and advances the schedule. Every layer on
   * step_lrs' device. */
  const DLTensor* step_lrs;  /* (groups,) fp32 */
  const DLTensor* loss;      /* (1,) fp32; NULL: no best kept */
  const DLTensor* best_loss; /* (1,) fp32; required with loss */
} qlink_signround_args;
#define QLINK_SIGNROUND_ARGS_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_signround_args, best_loss)
#define QLINK_SIGNROUND_ARGS_STRUCT_SIZE_1_7 QLINK_STRUCT_SIZE(qlink_signround_args, num_streams)
#define QLINK_SIGNROUND_ARGS_STRUCT_SIZE_1_9 QLINK_SIGNROUND_ARGS_STRUCT_SIZE

/* One tensor of SignSGD's step: param -= lr * sign(grad) (AutoRound's SignSGD with its
 * defaults: no momentum, no weight decay). */
typedef struct qlink_signsgd_param {
  size_t struct_size;
  const DLTensor* param; /* fp32, contiguous; updated in place */
  const DLTensor* grad;  /* fp32, param's shape */
  const DLTensor* best;  /* fp32, param's shape: param is copied here before the update
                            when loss < best_loss; NULL: not kept */
  int32_t lr_group;      /* its learning rate: element lr_group of args->lrs */
} qlink_signsgd_param;
#define QLINK_SIGNSGD_PARAM_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_signsgd_param, lr_group)
#define QLINK_SIGNSGD_PARAM_STRUCT_SIZE_1_7 QLINK_SIGNSGD_PARAM_STRUCT_SIZE

/* One step of one device's parameters, stream-ordered, every value it reads or writes on
 * the device: the best parameters kept (when loss is given and below best_loss, which
 * then becomes loss), every param updated with its group's learning rate, then the
 * schedule: epoch += 1 and every learning rate multiplied by LinearLR(start_factor 1,
 * end_factor 0, total_iters)'s factor for the new epoch, in fp32 as AutoRound's 0-dim
 * fp32 learning-rate tensors are. */
typedef struct qlink_signsgd_args {
  size_t struct_size;
  const qlink_signsgd_param* params; /* borrowed array of num_params, all on one device */
  size_t num_params;
  const DLTensor* lrs;         /* (groups,) fp32: each group's learning rate */
  const DLTensor* epoch;       /* (1,) int64: LinearLR's last_epoch; NULL: no schedule */
  int64_t total_iters;         /* LinearLR's total_iters (AutoRound: iters), >= 1 with epoch */
  const DLTensor* loss;        /* (1,) fp32: this iteration's loss; NULL: no best kept */
  const DLTensor* best_loss;   /* (1,) fp32; required with loss */
  const qlink_stream* streams; /* borrowed array of num_streams; may be NULL */
  size_t num_streams;
} qlink_signsgd_args;
#define QLINK_SIGNSGD_ARGS_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_signsgd_args, num_streams)
#define QLINK_SIGNSGD_ARGS_STRUCT_SIZE_1_7 QLINK_SIGNSGD_ARGS_STRUCT_SIZE

/* 1.10. A block's experts (same-shaped layers, AutoRound wrapping each its own linear)
 * through one call per pass instead of one per layer: on a GPU each pass is one kernel
 * launch over every expert. `tokens` says which experts the router gave tokens this
 * iteration; one without is skipped as AutoRound skips it (its wrapper is not called, so
 * its parameters get no gradient and SignSGD leaves them): its qdq, range factors and
 * gradients are not written and it takes no step, but its best copy is kept with the
 * others' (AutoRound's collect_best_params copies every wrapper). Results equal the 1.7 /
 * 1.9 calls made for each expert with tokens, bit for bit. */
typedef struct qlink_signround_experts_args {
  size_t struct_size;
  /* borrowed: options, the experts as layers, streams and 1.9's step, read as
   * signround_qdq / signround_qdq_backward read them; every layer's weight of layers[0]'s
   * shape and dtype, on its device */
  const qlink_signround_args* layers;
  /* borrowed: (num_layers,) int32 or int64 on the layers' device, each expert's routed
   * tokens this iteration (0: none); read on the device, never by the host, so a loop
   * may capture the call in a graph. NULL: every expert has tokens. */
  const DLTensor* tokens;
} qlink_signround_experts_args;
#define QLINK_SIGNROUND_EXPERTS_ARGS_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_signround_experts_args, tokens)
#define QLINK_SIGNROUND_EXPERTS_ARGS_STRUCT_SIZE_1_10 QLINK_SIGNROUND_EXPERTS_ARGS_STRUCT_SIZE

/* 1.10. SignSGD's step of a block's experts: step->params expert-major (params[e *
 * per_expert + k] is expert e's k-th tensor, per_expert = num_params / num_experts, the
 * k-th of one shape and lr_group for every expert); an expert without tokens is not
 * updated but kept as best with the rest; the schedule and best_loss advance once. */
typedef struct qlink_signsgd_experts_args {
  size_t struct_size;
  const qlink_signsgd_args* step; /* borrowed; read as signsgd_step reads it */
  size_t num_experts;             /* >= 1, dividing step->num_params */
  const DLTensor* tokens;         /* borrowed: (num_experts,) int32 or int64, as above; NULL: all */
} qlink_signsgd_experts_args;
#define QLINK_SIGNSGD_EXPERTS_ARGS_STRUCT_SIZE QLINK_STRUCT_SIZE(qlink_signsgd_experts_args, tokens)
#define QLINK_SIGNSGD_EXPERTS_ARGS_STRUCT_SIZE_1_10 QLINK_SIGNSGD_EXPERTS_ARGS_STRUCT_SIZE

typedef struct qlink_api {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;

  /* The message of the calling thread's last call: "" when it succeeded. Owned by
   * qlink, valid until this thread's next qlink call. Never NULL. */
  const char* (*last_error)(void);

  /* config_json: borrowed, NUL-terminated JSON object, or NULL / "" for the defaults.
   * *out: owned by the caller, released with context_destroy. */
  qlink_status (*context_create)(const char* config_json, qlink_context** out);
  /* ctx: owned, released here (NULL is a no-op). */
  qlink_status (*context_destroy)(qlink_context* ctx);

  /* *name: owned by ctx ("cpu", "cuda", "hip", ...), valid until context_destroy. */
  qlink_status (*backend_name)(const qlink_context* ctx, const char** name);
  qlink_status (*device_count)(const qlink_context* ctx, int32_t* count);
  /* info: borrowed, caller sets info->struct_size. */
  qlink_status (*device_info)(const qlink_context* ctx, int32_t device, qlink_device_info* info);

  /* Enables and (per config) probes every ordered pair of the borrowed device list.
   * Pairs are judged one by one; in p2p mode "auto" a refused pair is reported through
   * peer_info and one process-wide warning, in mode "on" it fails the call. */
  qlink_status (*enable_peer_access)(qlink_context* ctx, const int32_t* devices, size_t num_devices);
  /* info: borrowed, caller sets info->struct_size. */
  qlink_status (*peer_info)(const qlink_context* ctx, int32_t src_device, int32_t dst_device, qlink_peer_info* info);
  /* Times a copy of `bytes` from src to dst over the path copies would take.
   * out: borrowed, caller sets out->struct_size. */
  qlink_status (*measure_link)(qlink_context* ctx, int32_t src_device, int32_t dst_device, uint64_t bytes,
                               qlink_link_measurement* out);

  /* Validates, plans and enqueues one batch (see qlink_copy_args). */
  qlink_status (*copy_batch)(qlink_context* ctx, const qlink_copy_args* args);

  /* A prepared batch for moves repeated over the same memory (replica mirrors,
   * calibration staging): validation and planning happen once here, each
   * copy_plan_execute only enqueues. args->streams is ignored here.
   * *plan: owned by the caller, released with copy_plan_destroy, before ctx. */
  qlink_status (*copy_plan_create)(qlink_context* ctx, const qlink_copy_args* args, qlink_copy_plan** plan);
  /* streams: borrowed array of num_streams (may be NULL), as in qlink_copy_args. */
  qlink_status (*copy_plan_execute)(qlink_copy_plan* plan, const qlink_stream* streams, size_t num_streams);
  /* plan: owned, released here (NULL is a no-op). */
  qlink_status (*copy_plan_destroy)(qlink_copy_plan* plan);

  /* Device memory for hosts without an allocator of their own (C++ hosts, the CLI).
   * *ptr: owned by the caller, released with memory_free on the same device. */
  qlink_status (*memory_allocate)(qlink_context* ctx, int32_t device, uint64_t bytes, void** ptr);
  qlink_status (*memory_free)(qlink_context* ctx, int32_t device, void* ptr);
  /* Synchronous copies between host memory and `device`; both pointers borrowed. */
  qlink_status (*memory_to_host)(qlink_context* ctx, int32_t device, void* host_dst, const void* device_src,
                                 uint64_t bytes);
  qlink_status (*memory_from_host)(qlink_context* ctx, int32_t device, void* device_dst, const void* host_src,
                                   uint64_t bytes);
  /* Blocks until all work enqueued on `stream` (borrowed; NULL = default) is done. */
  qlink_status (*stream_synchronize)(qlink_context* ctx, int32_t device, void* stream);

  /* 1.1. Ordering as for copy_batch: each device's part waits for the work already on
   * that device's stream, later work there waits for the collective. */
  qlink_status (*broadcast)(qlink_context* ctx, const qlink_broadcast_args* args);
  qlink_status (*reduce)(qlink_context* ctx, const qlink_reduce_args* args);
  qlink_status (*all_reduce)(qlink_context* ctx, const qlink_all_reduce_args* args);

  /* 1.1, multi-process. The NCCL library is config field nccl_library (default
   * libnccl.so.2 for cuda, librccl.so.1 for hip), loaded on first use. out: borrowed. */
  qlink_status (*comm_unique_id)(qlink_context* ctx, qlink_unique_id* out);
  /* Joins rank `rank` of `nranks` on `device`; blocks until every rank has joined.
   * id: borrowed. *comm: owned by the caller, released with comm_destroy before ctx. */
  qlink_status (*comm_create)(qlink_context* ctx, const qlink_unique_id* id, int32_t nranks, int32_t rank,
                              int32_t device, qlink_comm** comm);
  qlink_status (*comm_destroy)(qlink_comm* comm);
  /* In place on every rank's buffer (borrowed; fp32 on the rank's device), enqueued on
   * `stream` (borrowed; NULL = default). op: qlink_reduce_op. */
  qlink_status (*comm_all_reduce)(qlink_comm* comm, const DLTensor* buffer, int32_t op, void* stream);
  /* Any dtype; root's bytes land in every rank's buffer. */
  qlink_status (*comm_broadcast)(qlink_comm* comm, const DLTensor* buffer, int32_t root, void* stream);
  /* fp32; root's buffer becomes scale * sum of every rank's buffer. */
  qlink_status (*comm_reduce)(qlink_comm* comm, const DLTensor* buffer, int32_t root, double scale, void* stream);

  /* 1.2. An all-reduce over fixed buffers (SignRound's gradients, every iteration):
   * validated and planned once here, each all_reduce_plan_execute only enqueues, as
   * all_reduce would. args->streams is ignored here.
   * *plan: owned by the caller, released with all_reduce_plan_destroy, before ctx. */
  qlink_status (*all_reduce_plan_create)(qlink_context* ctx, const qlink_all_reduce_args* args,
                                         qlink_all_reduce_plan** plan);
  /* streams: borrowed array of num_streams (may be NULL), as in qlink_all_reduce_args. */
  qlink_status (*all_reduce_plan_execute)(qlink_all_reduce_plan* plan, const qlink_stream* streams, size_t num_streams);
  /* plan: owned, released here (NULL is a no-op). */
  qlink_status (*all_reduce_plan_destroy)(qlink_all_reduce_plan* plan);

  /* 1.4. GPTQ. The engine's linear algebra comes from the vendor's libraries (config
   * fields blas_library / solver_library), loaded on first use: without them these calls
   * fail with QLINK_UNAVAILABLE naming the library, and everything else works. */
  qlink_status (*hessian_accumulate)(qlink_context* ctx, const qlink_hessian_args* args);
  qlink_status (*gptq_quantize)(qlink_context* ctx, qlink_gptq_args* args);

  /* 1.7. SignRound (see qlink_signround_args, qlink_signsgd_args). */
  qlink_status (*signround_qdq)(qlink_context* ctx, const qlink_signround_args* args);
  qlink_status (*signround_qdq_backward)(qlink_context* ctx, const qlink_signround_args* args);
  qlink_status (*signsgd_step)(qlink_context* ctx, const qlink_signsgd_args* args);

  /* 1.10. A block's experts (see qlink_signround_experts_args, qlink_signsgd_experts_args). */
  qlink_status (*signround_experts_qdq)(qlink_context* ctx, const qlink_signround_experts_args* args);
  qlink_status (*signround_experts_qdq_backward)(qlink_context* ctx, const qlink_signround_experts_args* args);
  qlink_status (*signsgd_experts_step)(qlink_context* ctx, const qlink_signsgd_experts_args* args);
} qlink_api;
#define QLINK_API_STRUCT_SIZE_1_0 QLINK_STRUCT_SIZE(qlink_api, stream_synchronize)
#define QLINK_API_STRUCT_SIZE_1_1 QLINK_STRUCT_SIZE(qlink_api, comm_reduce)
#define QLINK_API_STRUCT_SIZE_1_2 QLINK_STRUCT_SIZE(qlink_api, all_reduce_plan_destroy)
#define QLINK_API_STRUCT_SIZE_1_3 QLINK_API_STRUCT_SIZE_1_2 /* 1.3 added a flag, no entry */
#define QLINK_API_STRUCT_SIZE_1_4 QLINK_STRUCT_SIZE(qlink_api, gptq_quantize)
#define QLINK_API_STRUCT_SIZE_1_5 QLINK_API_STRUCT_SIZE_1_4 /* 1.5 added an option, no entry */
#define QLINK_API_STRUCT_SIZE_1_6 QLINK_API_STRUCT_SIZE_1_5 /* 1.6 added a field, no entry */
#define QLINK_API_STRUCT_SIZE_1_7 QLINK_STRUCT_SIZE(qlink_api, signsgd_step)
#define QLINK_API_STRUCT_SIZE_1_8 QLINK_API_STRUCT_SIZE_1_7 /* 1.8 added a field, no entry */
#define QLINK_API_STRUCT_SIZE_1_9 QLINK_API_STRUCT_SIZE_1_8 /* 1.9 added fields, no entry */
#define QLINK_API_STRUCT_SIZE_1_10 QLINK_STRUCT_SIZE(qlink_api, signsgd_experts_step)
#define QLINK_API_STRUCT_SIZE_1_11 QLINK_API_STRUCT_SIZE_1_10 /* 1.11 added a field, no entry */
#define QLINK_API_STRUCT_SIZE QLINK_API_STRUCT_SIZE_1_11

/* The one exported symbol. Returns the table of ABI `major` if this library provides
 * at least `min_minor`, else NULL with *error (when error is non-NULL) pointing at a
 * message naming both versions (owned by qlink, per thread). The table is owned by
 * the library and lives until it is unloaded. */
const qlink_api* qlink_get_api(uint32_t major, uint32_t min_minor, const char** error);

typedef const qlink_api* (*qlink_get_api_fn)(uint32_t major, uint32_t min_minor, const char** error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QLINK_H_ */
