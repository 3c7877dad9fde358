"""GPTQModel through qlink:

    import qlink.integrations.gptqmodel as qlink_gptqmodel
    qlink_gptqmodel.install({"mode": "auto"})     # a P2PConfig, a dict of its fields, or a whole config
    ... GPTQModel.load(...).quantize(...) as usual ...
    qlink_gptqmodel.counters()                     # what ran through qlink, what did not and why

SEAMS is the one list of what install() replaces in GPTQModel: each seam's host target,
the module of this package that implements it, what it replaces and its counters
(docs/HOSTS.md shows it as a table). GPTQModel swallows clone errors and falls back to
deepcopy; with strict=True every seam whose qlink path fails raises FallbackRefused
instead of running the host's code."""
from ...defaults import configure
from ..base import HostSpec, Integration
from ..seams import Seam, SeamTable
from . import (attention_outputs, cpu_pool, expert_stage, gptq, hooked_linear, looper_helpers, model_moves,
               module_looper, qlinear)
from .defuser_moe import make_run_routed_experts
from .installation import GPTQModelInstallation

_HELPERS, _MODEL = "gptqmodel.utils.looper_helpers:", "gptqmodel.utils.model:"
_GPTQ = "gptqmodel.quantization.gptq:GPTQ."
_LOOPER = "gptqmodel.looper.module_looper:ModuleLooper."
_STRUCTURE = "gptqmodel.utils.structure:"
# GPTQ's task state the task class's methods read and write, as GPTQModel's own do.
_TASK_STATE = [_GPTQ + name for name in (
    "add_batch", "materialize_global_hessian", "quantize", "finalize_hessian", "_select_hessian_target_device",
    "lock", "H", "nsamples", "columns", "name", "qcfg", "module", "quantizer", "module_copy", "fallback",
    "expected_nsamples", "_tp_pad_cols", "fwd_counter", "_device_hessian_partials", "_device_sample_counts",
    "_hessian_dirty", "_final_hessian_device_hint")]


def _reading_ahead(installation):
    return installation.read_ahead != "off"


def _keeping_attention(installation):
    return installation.keep_attention


def _stopping_products(installation):
    return installation.stopped_products


def _routed(installation, original):
    installation.host.routed = True
    return make_run_routed_experts(installation, original)


SEAMS = SeamTable("gptqmodel", [
    Seam(_HELPERS + "clone_module_for_devices", "looper_helpers",
         "a layer's replicas for the forward workers, {device: replica} in device order",
         ["clone_module_for_devices"], looper_helpers.make_clone_module_for_devices, how="everywhere",
         reads=[_HELPERS + "clear_non_picklable_state",
                "gptqmodel.looper.forward_executor:ForwardExecutor.run_parallel",  # binds the clone as a default
                "gptqmodel.looper.module_looper:clone_module_for_devices"]),       # imports it by name
    Seam(_HELPERS + "torch_replicate", "looper_helpers",
         "torch.nn.parallel.replicate (broadcast_coalesced): qlink's broadcast instead",
         ["torch_replicate"], looper_helpers.make_torch_replicate, how="everywhere"),
    Seam(_MODEL + "move_to", "model_moves",
         "tensor and module moves: CPU tensors through pinned twins on the target's stream",
         ["move_to"], model_moves.make_move_to, how="everywhere"),
    Seam(_MODEL + "nested_move_to", "model_moves", "calibration batches' moves, twins kept for the next subset",
         ["nested_move_to"], model_moves.make_nested_move_to, how="everywhere"),
    Seam(_STRUCTURE + "safe_open", "structure", "the checkpoint's shard handles: the next layer's tensors read ahead",
         ["layer_prefetch", "module_refill"], lambda inst, original: inst.prefetch.make_safe_open(),
         when=_reading_ahead),
    Seam(_STRUCTURE + "_get_qualified_name", "qualified_names",
         "a module's name for its fill, by a walk of the whole model: an index of the model's modules",
         ["qualified_names"], lambda inst, original: inst.paths.make(original)),
    Seam(_STRUCTURE + "LazyTurtle.materialize_submodule", "structure",
         "each layer's fill from the checkpoint (the next read on a helper thread; a layer's modules' second "
         "fills copied on the device)", ["layer_prefetch", "module_refill"],
         lambda inst, original: inst.prefetch.make_materialize_submodule(original, inst.paths.qualified_name),
         when=_reading_ahead,
         reads=[_STRUCTURE + "_get_qualified_name", _STRUCTURE + "LazyTurtle._resolve_checkpoint_module_path",
                _STRUCTURE + "LazyTurtle._weight_map", _STRUCTURE + "LazyTurtle.model_local_path"]),
    Seam("gptqmodel.models.base:BaseQModel.pre_quantize", "attention_outputs",
         "a layer made ready for its subsets, whose forwards each run its attention block again: the block's "
         "outputs kept while its inputs and weights stay (a copy returned, bit for bit), and the block's and "
         "the MLP's last-linear inputs, which answer a rerun changed only in that linear (tail_inputs)",
         ["attention_outputs", "tail_inputs"], attention_outputs.make_pre_quantize, when=_keeping_attention),
    Seam("gptqmodel.models.base:BaseQModel.post_quantize", "attention_outputs",
         "the finished layer's move to the CPU: the kept outputs dropped first", ["attention_outputs"],
         attention_outputs.make_post_quantize, when=_keeping_attention),
    Seam("gptqmodel.nn_modules.hooked_linear:HookedLinear.forward", "hooked_linear",
         "a subset forward's hooked linears computing products that only their hooks see (GPTQ's reads the "
         "input alone) before StopForward drops them: those products left uncomputed", ["stopped_products"],
         hooked_linear.make_forward, when=_stopping_products,
         reads=["gptqmodel.nn_modules.hooked_linear:" + name for name in (
             "_materialize_if_meta_weight", "emit_device_telemetry", "apply_online_hadamard",
             "_restore_output_device", "STOP_FORWARD_EXCEPTION")]),
    Seam("gptqmodel:_default_cpu_workers", "cpu_pool",
         "the size of GPTQModel's CPU pool, which runs each module's finalize (pack, disk offload) beside the "
         "next layer: min(12, cores / 2) threads", ["cpu_workers"], cpu_pool.make_default_cpu_workers,
         when=lambda inst: inst.cpu_workers is not None, reads=["gptqmodel:_DEVICE_THREAD_POOL"]),
    Seam(_LOOPER + "loop", "module_looper", "the layer loop, run inside the process settings install() asks for",
         ["switch_interval", "fixed_segments"], module_looper.make_loop),
    Seam(_LOOPER + "cache_inputs", "module_looper",
         "the calibration capture's cache: moved to the one GPU once, one-sample batches grouped; layer 0's "
         "landing page-locked meanwhile", ["cache_inputs", "group_batches", "pinned_warmup"],
         module_looper.make_cache_inputs,
         reads=[_LOOPER + "gptq_model", _LOOPER + "processors", _LOOPER + "support_batch_quantize",
                _LOOPER + "moe_routing_override", _LOOPER + "moe_routing_bypass",
                "gptqmodel.looper.gptq_processor:GPTQProcessor", "gptqmodel.models.base:BaseQModel",
                "gptqmodel.models.base:BaseQModel.dynamic_expert_index",
                "gptqmodel.models.base:BaseQModel.prepare_layer_replay_kwargs",
                "gptqmodel.models.base:BaseQModel.update_layer_replay_kwargs_from_output",
                "gptqmodel.looper.input_cache:InputCache"]),
    Seam(_LOOPER + "_rehome_processor_task", "module_looper",
         "a task's quantizer moved by Module.to's pageable copies before each subset", ["rehome_processor_task"],
         module_looper.make_rehome_processor_task),
    Seam("gptqmodel.looper.gptq_processor:GPTQ", "gptq",
         "the processor's tasks: per-batch Hessians, their merge and the solve (qlink's native engine where it "
         "covers the options)", ["add_batch", "materialize_global_hessian", "quantize"], gptq.make_task_class,
         reads=["gptqmodel.quantization.gptq:GPTQ", "gptqmodel.quantization.quantizer:Quantizer",
                "gptqmodel.quantization.quantizer:Quantizer.requires_groupwise_processing",
                "gptqmodel.quantization.quantizer:Quantizer.perchannel",
                "gptqmodel.utils.fallback:should_use_fallback"] + _TASK_STATE),
    Seam("gptqmodel.looper.gptq_processor:GPTQProcessor.submodule_finalize", "finalize_lookups",
         "each module's finalize, which finds that module by walks of the whole model (quadratic in the layers): "
         "down its own path", ["finalize_lookups"],
         lambda inst, original: inst.lookups.make_submodule_finalize(original)),
    Seam("gptqmodel.looper.gptq_processor:find_modules", "finalize_lookups",
         "the processor's walk of the model, in a finalize: the finalized module's own path",
         ["finalize_lookups"], lambda inst, original: inst.lookups.make_find_modules(original),
         reads=["gptqmodel.utils.model:SUPPORTS_MODULE_TYPES"]),
    Seam("gptqmodel.utils.offload:get_module_fullname", "finalize_lookups",
         "the offload's name of a module by a walk of every module: the name its finalize had",
         ["finalize_lookups"], lambda inst, original: inst.lookups.make_get_module_fullname(original)),
    Seam("gptqmodel.nn_modules.qlinear.pack_block_ext:pack_block_cpu", "qlinear",
         "the native packer's slot: the same int32 words on the GPU", ["pack"], qlinear.make_pack_block_cpu),
    Seam("gptqmodel.nn_modules.qlinear:PackableQuantLinear.pack_block", "qlinear",
         "the finalizers' packing, which swallows its packer's errors: a strict refusal raised naming the layer",
         ["pack"], qlinear.make_pack_block),
    Seam("defuser.modeling.unfused_moe.common:run_routed_experts", "defuser_moe",
         "a split MoE block's routed experts' loop: one host read a forward, the same output (with "
         "expert_stage, a forward nothing watches as grouped GEMMs)",
         ["routed_experts", "grouped_replay"], _routed, how="everywhere", package="defuser"),
    Seam("gptqmodel.looper.stage_subset:run_subset_stage", "expert_stage",
         "an MoE block's expert subsets: a hooked forward per batch calling each expert's linears, "
         "per-expert add_batch: qlink's grouped pass over every batch, a Hessian per expert",
         ["expert_stage"], expert_stage.make_run_subset_stage, how="everywhere",
         reads=["gptqmodel.looper.stage_layer:run_subset_stage",  # imports it by name
                "gptqmodel.looper.stage_subset:SubsetPlan", "gptqmodel.looper.stage_subset:SubsetStageResult",
                _LOOPER + "_prepare_named_module_for_forward", "gptqmodel.looper.stage_subset:SubsetPlan.for_modules",
                "gptqmodel.looper.gptq_processor:GPTQProcessor.tasks", _LOOPER + "_quant_devices",
                "gptqmodel.looper.named_module:NamedModule.state"]),
])
HOST = HostSpec("GPTQModel", "gptqmodel", "gptqmodel.version", "7.3", "f4c327a", SEAMS.host_names())

_integration = Integration()


def install(config=None, strict=False, *, ctx=None, library=None, read_ahead="pinned", switch_interval=None,
            fixed_segments=True, hessian_precision="tensor_gemm", inverse="triangular", tf32=True,
            attention_outputs=True, tail_inputs=True, stopped_products=True, expert_stage=True,
            expert_budget=None, cpu_workers=None):
    """Routes this process's GPTQModel through qlink (see the module's docstring); a second
    install replaces the first.

    config: the qlink context's config (a P2PConfig, a dict of its fields, or a whole
    config), made the process default context; or ctx: a context to use instead. strict:
    a failing qlink path raises FallbackRefused instead of running GPTQModel's own.
    read_ahead (layer_prefetch): "pinned" reads the next layer into page-locked memory on
    a GPU (its fill's copies do not block; page-locking a layer's worth stalls the
    process's CUDA calls while it runs), "pageable" into pageable memory (the fill's copies
    block as GPTQModel's own), "off" leaves GPTQModel's fills alone.
    switch_interval: seconds (1e-4, say) the interpreter's switch interval is shortened to
    for the layer loop, or None (the default) to leave it: with the tensor-core Hessians it
    buys a few percent of a loop (bench/RESULTS.md), too little to assume.
    fixed_segments: True (the default) runs the layer loop with PyTorch's CUDA allocator
    making fixed segments where the process asked for expandable ones (GPTQModel asks as it
    is imported; docs/HOSTS.md says what that cost); False leaves the allocator as set.
    hessian_precision: how the loop's Hessians sum 16-bit activations' products:
    "tensor_gemm" (the default: the vendor's GemmEx on the tensor cores, 2048 rows a call,
    IEEE where the backend has none), "tensor" (qlink's kernel on CUDA, its sums promoted
    every 32 rows), "ieee_fp32", or None for the context config's hessian_precision. Each
    tensor-core choice's perplexity on a trained model is within calibration noise of
    GPTQModel's own, the vendor's GEMM the fastest (docs/HOSTS.md).
    inverse: how the engine makes each Hessian's inverse factor: "triangular" (the default:
    a quarter of the flops, the same factor to fp32 rounding; qlink.quant.gptq_quantize) or
    "cholesky_inverse" (GPTQModel's own calls). tf32: True (the default) lets the engine's
    cross-block updates (W -= E U, GPTQModel's fp32 matmul) run on TF32 tensor cores where the
    backend has them; False keeps IEEE fp32, as GPTQModel runs them. Both defaults were judged
    on a trained model's perplexity, within calibration noise of GPTQModel's (docs/HOSTS.md).
    attention_outputs: True (the default, where the forwards run on one device) keeps each
    layer's attention block outputs across the layer's forwards while its inputs and weights
    stay the same, and returns copies of them instead of running the block again (the same
    bytes; attention_outputs.py); False runs the block in every forward. tail_inputs: True
    (the default, with attention_outputs) keeps the block's o_proj input and the MLP's
    down_proj input of each batch, so a rerun changed only in that linear is that linear of
    the kept input (the same bytes, checked once a layer; tail_inputs.py).
    stopped_products: True (the default) leaves uncomputed the product of each subset
    forward's last hooked linear, which only GPTQ's hook sees (it reads the input alone)
    before the forward stops (hooked_linear.py); False computes it as GPTQModel does.
    expert_stage: True (the default) runs an MoE block's expert subsets through qlink's owned
    stage (docs/MOE.md: 1.5x qlink's per-batch path on a Qwen3-30B-A3B layer, its losses within
    0.015 % of that path's); False leaves them to GPTQModel's forwards and qlink's add_batch.
    Where GPTQModel quantizes on several GPUs, the stage places the experts over them in
    ranges, each expert's Hessian summed and solved on its GPU.
    expert_budget: bytes one chunk of that stage's expert solves may take on a GPU (each
    Hessian twice over, with its inverse, and 3 bytes a weight; the forwards run once for
    every GPU's next chunk), or None for half each GPU's free memory (no bound in CPU memory).
    cpu_workers: the threads of GPTQModel's CPU pool, which finalizes each quantized module
    (its pack and disk offload) beside the next layer, where the interpreter has a GIL (their
    Python takes it from the loop: cpu_pool.py), or None (the default) for GPTQModel's size,
    min(12, cores / 2): 2 threads bought an MoE layer nothing measurable and lengthened a 70B
    layer's drain (bench/RESULTS.md). GPTQMODEL_CPU_WORKERS, where set, wins; a pool started
    before install() keeps its size.
    GPTQModel's version is checked against HOST's (another warns once; UnsupportedHost
    under strict) and every name the seams touch must be where HOST says (HostChanged
    naming each that moved); nothing is replaced otherwise."""
    uninstall()
    installation = GPTQModelInstallation(ctx or configure(config, library), strict, SEAMS, HOST, read_ahead,
                                         switch_interval, fixed_segments, hessian_precision, inverse, tf32,
                                         attention_outputs, tail_inputs, stopped_products, expert_stage,
                                         expert_budget, cpu_workers)
    return _integration.install(installation).ctx


def uninstall():
    """Restores every binding install() changed that is still qlink's; returns what it left
    (Integration.uninstall)."""
    return _integration.uninstall()


def flush_hessians():
    """Makes the add_batch calls still queued (one native call) and lands them in their
    tasks. GPTQModel never needs it (it reads the partials through materialize_global_hessian,
    which flushes first); a caller reading _device_hessian_partials itself does."""
    current = _integration.current
    if current is not None:
        current.queue.flush()


def counters():
    """What ran through qlink, by section ({} when not installed): "seams", per counter, the
    calls through qlink, through the host by design ("host") or after qlink failed
    ("fallback"), and why; "hessians", the add_batch accumulations (run, shared, rows,
    native calls); "solves", the engine calls (made, layers, answered ahead, refused,
    spread over every device); "packs", the layers' words made with a solve call ("made"),
    taken by their finalizers, missed (their inputs were not the solve's), dropped, refused;
    "staging", the moves' host staging (copies, twins, bytes);
    "experts", the expert stage's blocks, experts, experts no token reached ("empty") or
    below their fallback threshold ("few"), rows and Hessian chunks."""
    return _integration.counters()
