"""AutoRound through qlink:

    import qlink.integrations.autoround as qlink_autoround
    qlink_autoround.install(parallel_quantization="auto")   # or N, or "off"
    ... AutoRound(model, tokenizer, ...).quantize() as usual ...
    qlink_autoround.plans()       # per block: the world, the devices, why others were left out
    qlink_autoround.counters()    # what ran data-parallel, what ran serial and why

SEAMS is the one list of what install() replaces in AutoRound (docs/HOSTS.md shows it as
a table). The plan (qlink.plan) is resolved per block on the context's devices and their
free memory: an explicit N that cannot engage raises PlanRefused naming every reason; auto
with fewer than two usable devices runs the native loop on one and says why, once per
reason; "off" runs AutoRound's own code."""
from ...defaults import configure
from ..base import HostSpec, Integration
from ..seams import Seam, SeamTable
from .grouped_moe import make_linear_loop_experts_forward, make_sequential_moe_forward
from .installation import _BASE, _INPUTS, _ORCHESTRATOR, _RTN, _SIGN_ROUND, AutoRoundInstallation
from .scale_search import make_search_scales

_QUANTIZER_STATE = [_SIGN_ROUND + "." + name for name in (
    "_compute_valid_token_mask", "_get_loss", "_scale_loss_and_backward", "_get_non_zero_cnt", "_step",
    "_maybe_log_low_bit_lr", "wrapper_block", "block_forward", "calibration_context", "compress_context",
    "enable_quanted_input", "gradient_accumulate_steps", "not_use_best_mse", "dynamic_max_gap", "optimizer",
    "momentum", "lr_scheduler", "iters", "lr", "minmax_lr", "enable_minmax_tuning", "enable_norm_bias_tuning",
    "_config", "_cached_valid_token_mask", "_card_0_in_high_risk", "_loss_device")]


def _method(name):
    """make(installation, original) for the installation's _make_<name>."""
    return lambda installation, original: getattr(installation, "_make_" + name)(original)


SEAMS = SeamTable("auto_round", [
    Seam(_SIGN_ROUND + ".quantize_block", "installation, native_loop, parallel_tuning, grouped_unwrap",
         "a block's SignRound tuning: data-parallel over replicas, or qlink's native loop on one device",
         ["quantize_block", "step_graph", "compiled_loss", "v_step", "grouped_experts", "grouped_unwrap"],
         _method("quantize_block"),
         reads=[_SIGN_ROUND, "auto_round.algorithms.quantization.sign_round.sign_sgd:SignSGD",
                "auto_round.compressors.utils:IndexSampler", "auto_round.compressors.utils:collect_best_params",
                "auto_round.wrapper:unwrapper_block", "auto_round.wrapper:WrapperLinear", "auto_round.logger:logger",
                "auto_round.utils:check_to_quantized", "auto_round.utils:set_module",
                "auto_round.utils.device_manager:device_manager", "auto_round.utils:SUPPORTED_LAYER_TYPES",
                "auto_round.algorithms.block_runner:BlockForwardRunner.select_batch",
                "auto_round.algorithms.block_runner:BlockForwardRunner._forward_one_batch",
                "auto_round.algorithms.block_runner:BlockForwardRunner._normalize_output"] + _QUANTIZER_STATE),
    Seam(_SIGN_ROUND + ".dispatch_block", "installation",
         "a block's weights moved to the tuning GPU by Module.to's pageable copies", ["block_dispatch"],
         _method("dispatch_block")),
    Seam(_BASE + ".dispatch_block", "installation",
         "iters=0 (the RTN quantizers): a block's weights moved to the primary GPU by Module.to's pageable "
         "copies", ["block_dispatch"], _method("base_dispatch_block")),
    Seam("auto_round.utils.model:mv_module_from_gpu", "installation",
         "a quantized block (or layer, or the model) back to the CPU by Module.to's pageable copies, a wait each",
         ["module_from_gpu"], _method("module_from_gpu"), how="everywhere"),
    Seam(_RTN + "RTNQuantizer.quantize_block", "installation, grouped_unwrap",
         "iters=0: a block's layers' RTN one after another", ["rtn_layers", "grouped_unwrap"],
         _method("rtn_quantize_block"),
         reads=[_RTN + "RTNQuantizer", "auto_round.utils:get_module", "auto_round.wrapper:WrapperLinear"]),
    Seam(_RTN + "OptimizedRTNQuantizer.quantize_block", "installation, grouped_unwrap",
         "iters=0: a block's layers' optimized RTN search one after another", ["rtn_layers", "grouped_unwrap"],
         _method("rtn_quantize_block"), reads=[_RTN + "OptimizedRTNQuantizer"]),
    Seam("auto_round.data_type.int:search_scales", "scale_search",
         "iters=0: optimized RTN's search of a layer's scales, two waits for the GPU for each of 200 candidates",
         ["scale_search"], make_search_scales,
         reads=["auto_round.data_type.int:get_reciprocal", "auto_round.data_type.int:envs"]),
    Seam(_BASE + "._quantize_layer_via_rtn", "installation",
         "a layer's RTN: deferred while a block's RTN runs (spread over the devices, or stacked by shape on one)",
         ["rtn_layers"], _method("quantize_layer_via_rtn")),
    Seam(_ORCHESTRATOR + ".quantize", "installation",
         "the whole run: its gc.collect() calls walk every object the process holds", ["frozen_gc"],
         _method("quantize"), reads=[_ORCHESTRATOR]),
    Seam(_INPUTS + "to_device", "installation",
         "a block's cached inputs moved to the cache device tensor by tensor, pageable", ["block_inputs"],
         _method("inputs_to_device"), reads=[_INPUTS + "preprocess_block_inputs"]),
    Seam("auto_round.modeling.fused_moe.utils:sequential_moe_forward", "grouped_moe",
         "an unfused MoE block's experts one module call after another: two grouped GEMMs (grouped_moe=True)",
         ["grouped_moe"], make_sequential_moe_forward, how="everywhere"),
    Seam("auto_round.modeling.fused_moe.moe_experts_interface:linear_loop_experts_forward", "grouped_moe",
         "transformers 5's experts (Qwen3-MoE): each expert's linears called in turn: two grouped GEMMs "
         "(grouped_moe=True)", ["grouped_moe"], make_linear_loop_experts_forward, how="everywhere",
         reads=["auto_round.modeling.fused_moe.utils:force_all_experts_routing_enabled",
                "auto_round.modeling.fused_moe.moe_experts_interface:ALL_EXPERTS_FUNCTIONS",
                "auto_round.modeling.fused_moe.moe_experts_interface:LINEAR_LOOP_IMPL"]),
])
HOST = HostSpec("AutoRound", "auto_round", "auto_round.version", "0.15", "b9f3d00", SEAMS.host_names())

_integration = Integration()


def install(parallel_quantization="auto", strict=False, *, config=None, ctx=None, library=None, transport="fp32",
            check_replicas=False, grouped_moe=True):
    """Makes this process's AutoRound tune blocks data-parallel (see the module's docstring);
    a second install replaces the first.

    parallel_quantization: "auto", an int N, or "off" (AutoRound's own serial code).
    config: the qlink context's config, made the process default context; or ctx: a
    context to use instead. transport: "fp32" or "bf16" for the gradient exchange.
    check_replicas: compare every replica's tuning parameters with home's after each step
    (ReplicaDiverged if they differ; a test aid, it synchronizes every step). strict: a
    block whose replicas qlink fails to make raises FallbackRefused instead of running
    AutoRound's serial loop. grouped_moe: True (the default) runs an unfused MoE block's
    experts as two grouped GEMMs on GPUs that have them (grouped_moe.py; within bf16
    rounding of AutoRound's loop, the tuned blocks' error within AutoRound's own spread:
    bench/RESULTS.md); False leaves AutoRound's loop.
    AutoRound's version is checked against HOST's (another warns
    once; UnsupportedHost under strict) and every name the patches touch must be where
    HOST says (HostChanged naming each that moved); nothing is patched otherwise."""
    uninstall()
    installation = AutoRoundInstallation(ctx or configure(config, library), strict, SEAMS, HOST,
                                         parallel_quantization, transport, check_replicas, grouped_moe)
    return _integration.install(installation).ctx


def uninstall():
    """Restores AutoRound's own quantize_block methods where they are still qlink's;
    returns what it left (Integration.uninstall)."""
    return _integration.uninstall()


def counters():
    """What ran through qlink, by section ({} when not installed): "seams", per counter, the
    blocks run through qlink, serial ("host") and why."""
    return _integration.counters()


def losses():
    """(block name, each iteration's loss) for every block the native loop tuned since
    install(), in order."""
    return list(_integration.current.losses) if _integration.current is not None else []


def plans():
    """(block name, qlink.plan.Plan) for every block seen since install(), in order."""
    return list(_integration.current.plans) if _integration.current is not None else []
