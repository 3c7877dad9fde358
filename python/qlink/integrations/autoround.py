"""AutoRound through qlink:

    import qlink.integrations.autoround as qlink_autoround
    qlink_autoround.install(parallel_quantization="auto")   # or N, or "off"
    ... AutoRound(model, tokenizer, ...).quantize() as usual ...
    qlink_autoround.plans()       # per block: the world, the devices, why others were left out
    qlink_autoround.counters()    # what ran data-parallel, what ran serial and why

What install() changes (each a patch with its own counters; the same install, uninstall,
counters and strict as the GPTQModel integration's, integrations/base.py):
  quantize_block  SignRoundQuantizer.quantize_block, AutoRound's block tuning: data-parallel
                  over the plan's replicas (autoround_tuning.py; pure SignSGD exchanges
                  sign(sum of gradients), anything else the fp32 (or bf16) sum), and on
                  one device qlink's native loop (autoround_native.py: the engine's
                  quant-dequant and SignSGD step, no host synchronization inside the loop)
  step_graph      per block of the native loop: its iteration replayed as a CUDA graph
                  ("qlink"), or eager and why ("host")
  compiled_loss   per block of the native loop: AutoRound's loss compiled into one kernel, or
                  why it runs eager
  v_step          per block of the native loop: the rounding offsets' SignSGD step taken
                  inside the quant-dequant's backward (one backward an iteration), or why
                  their gradients are stored and stepped after
  block_inputs    the move of a block's cached inputs to AutoRound's cache device before its
                  tuning (preprocess_block_inputs' to_device): host tensors to a GPU all at once
                  through qlink's moves (a large one-time move streams through page-locked
                  slots: 2 GiB of the first block's inputs, captured on the CPU, went over as
                  128 pageable copies with the GPU idle), a per-sample list into one
                  allocation (its tensors views of it), dicts updated in place as AutoRound's
                  own to_device does
  block_dispatch  SignRoundQuantizer.dispatch_block on one device: the block's weights moved to the
                  tuning GPU through qlink's moves (streamed through page-locked slots) instead
                  of Module.to's pageable copies, each waited for; AutoRound's own where it
                  spreads a block over several devices
  frozen_gc       CompressionOrchestrator.quantize, the whole run: the objects older than the
                  call frozen out of the garbage collector for its length (host_gc.py), so
                  AutoRound's gc.collect() between blocks walks only what the run made
  rtn_layers      iters=0 (RTN and optimized RTN): the block's per-layer searches spread over
                  the plan's devices, each layer on one device, moved there and back by qlink
                  (no fallback: AutoRound's own loop has run when qlink's moves start, so a
                  failure propagates rather than run the block twice)

The plan (qlink.plan) is resolved per block on the context's devices and their free memory:
an explicit N that cannot engage raises PlanRefused naming every reason; auto with fewer
than two usable devices runs the native loop on one and says why, once per reason; "off"
runs AutoRound's own code."""
import importlib
import logging
import random

import torch

from ..defaults import configure
from ..host_staging import stageable
from ..plan import check_setting, resolve_plan
from ..quant.placement import Placement
from .autoround_native import NativeTuning, check, unsupported
from .autoround_tuning import finish_block, make_mirrors, move_tensor_attributes, run_on_replicas, tune_block
from .base import HostSpec, Installation, Integration
from .host_gc import frozen_gc
from .patches import like

PATCHES = ("quantize_block", "rtn_layers", "step_graph", "compiled_loss", "v_step", "block_inputs", "block_dispatch",
           "frozen_gc")
TRANSPORTS = ("fp32", "bf16")

_SIGN_ROUND = "auto_round.algorithms.quantization.sign_round.quantizer:SignRoundQuantizer"
_RTN = "auto_round.algorithms.quantization.rtn.quantizer:"
_ORCHESTRATOR = "auto_round.compressors.orchestrator:CompressionOrchestrator"
_INPUTS = "auto_round.calibration.inputs:"
# Every AutoRound name the patches replace, call or read.
HOST = HostSpec("AutoRound", "auto_round", "auto_round.version", "0.15", "b9f3d00", [
    _SIGN_ROUND, _ORCHESTRATOR, _ORCHESTRATOR + ".quantize", _INPUTS + "to_device", _INPUTS + "preprocess_block_inputs",
    _RTN + "RTNQuantizer", _RTN + "OptimizedRTNQuantizer",
    _RTN + "RTNQuantizer.quantize_block", _RTN + "OptimizedRTNQuantizer.quantize_block",
    _RTN + "RTNQuantizer._quantize_layer_via_rtn",
    "auto_round.algorithms.quantization.sign_round.sign_sgd:SignSGD",
    "auto_round.compressors.utils:IndexSampler", "auto_round.compressors.utils:collect_best_params",
    "auto_round.wrapper:unwrapper_block", "auto_round.logger:logger", "auto_round.utils.device_manager:device_manager",
    "auto_round.utils:get_module", "auto_round.utils:SUPPORTED_LAYER_TYPES",
    "auto_round.algorithms.block_runner:BlockForwardRunner.select_batch",
    "auto_round.algorithms.block_runner:BlockForwardRunner._forward_one_batch",
    "auto_round.algorithms.block_runner:BlockForwardRunner._normalize_output",
] + [_SIGN_ROUND + "." + name for name in (
    "quantize_block", "dispatch_block", "_compute_valid_token_mask", "_get_loss", "_scale_loss_and_backward",
    "_get_non_zero_cnt", "_step", "_maybe_log_low_bit_lr", "wrapper_block", "block_forward", "calibration_context",
    "compress_context", "enable_quanted_input", "gradient_accumulate_steps", "not_use_best_mse", "dynamic_max_gap",
    "optimizer", "momentum", "lr_scheduler", "iters", "lr", "minmax_lr", "enable_minmax_tuning",
    "enable_norm_bias_tuning", "_config")])

log = logging.getLogger("qlink")
_integration = Integration()


class _Host:
    """The AutoRound classes and functions the patches use."""

    def __init__(self, names):
        self.SignRoundQuantizer = names[_SIGN_ROUND]
        self.CompressionOrchestrator = names[_ORCHESTRATOR]
        self.RTNQuantizer = names[_RTN + "RTNQuantizer"]
        self.OptimizedRTNQuantizer = names[_RTN + "OptimizedRTNQuantizer"]
        self.inputs, self.inputs_to_device = importlib.import_module(_INPUTS[:-1]), names[_INPUTS + "to_device"]
        for name in HOST.names:
            short = name.rpartition(":")[2]
            if "." not in short and not hasattr(self, short):
                setattr(self, short, names[name])


def _nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def _one_per_sample(value):
    """Whether `value` is a list of host tensors of one shape and dtype, each stageable
    (AutoRound's per-sample cache of a block's first input)."""
    return (isinstance(value, list) and len(value) > 1 and all(stageable(t) is None for t in value)
            and len({(tuple(t.shape), t.dtype) for t in value}) == 1)


def _quantized_linears(block):
    return [m for m in block.modules() if isinstance(m, torch.nn.Linear) and getattr(m, "bits", 16) <= 8]


class _Installation(Installation):
    PATCHES, HOST = PATCHES, HOST

    def __init__(self, ctx, strict, parallel, transport, check_replicas):
        check_setting(parallel)
        if transport not in TRANSPORTS:
            raise ValueError("transport must be one of %s, got %r" % (TRANSPORTS, transport))
        super().__init__(ctx, strict)
        self.parallel, self.transport, self.check_replicas = parallel, transport, check_replicas
        self.host = _Host(self.names)
        self.plans = []         # (block name, Plan), in the order the blocks came
        self._placements = {}   # devices -> Placement (its worker threads kept between blocks)
        self._said = set()      # serial reasons already logged
        self.losses = []        # (block name, each iteration's loss) of the native loop

    def apply(self):
        h, bind = self.host, self.rebindings
        bind.set(h.SignRoundQuantizer, "quantize_block", self._make_quantize_block(h.SignRoundQuantizer.quantize_block))
        for cls in (h.RTNQuantizer, h.OptimizedRTNQuantizer):
            bind.set(cls, "quantize_block", self._make_rtn_quantize_block(vars(cls)["quantize_block"]))
        bind.set(h.CompressionOrchestrator, "quantize", self._make_quantize(h.CompressionOrchestrator.quantize))
        bind.set(h.inputs, "to_device", self._make_inputs_to_device(h.inputs_to_device))
        bind.set(h.SignRoundQuantizer, "dispatch_block", self._make_dispatch_block(h.SignRoundQuantizer.dispatch_block))

    def _make_quantize(self, original):
        counters = self.counters

        @like(original)
        def quantize(orchestrator, *args, **kwargs):
            with frozen_gc() as reason:
                counters.record("frozen_gc", reason)
                return original(orchestrator, *args, **kwargs)
        return quantize

    def _make_inputs_to_device(self, original):
        ctx, counters, guard = self.ctx, self.counters, self.guard

        @like(original)
        def to_device(input, device=torch.device("cpu")):
            target = torch.device(device) if isinstance(device, (str, torch.device)) else None
            reason = self._not_a_gpu(target, device)
            if reason:
                counters.host("block_inputs", reason)
                return original(input, device)

            def move():
                if _one_per_sample(input):
                    # One allocation for the block's samples: after AutoRound's clear_memory
                    # emptied the allocator's cache, a GPU allocation each (128 x 16 MiB) took
                    # 0.15 s of the first block's move.
                    rows = torch.empty((len(input),) + tuple(input[0].shape), dtype=input[0].dtype, device=target)
                    return ctx.host_staging.to_device(input, target, into=list(rows.unbind(0)))
                moved = ctx.move_nested_to_device(input, target)
                if isinstance(input, dict):  # AutoRound's to_device updates a dict in place
                    input.update(moved)
                    return input
                return moved
            return guard.attempt("block_inputs", move, lambda: original(input, device))
        return to_device

    def _not_a_gpu(self, target, asked):
        """Why qlink's moves do not take a move to `target` (the torch device `asked` for, or
        None), or None."""
        if self.ctx.host_memory or target is None or target.type != "cuda":
            return "not a GPU of a GPU backend (%s, %s)" % (asked, self.ctx.backend)
        return None

    def _make_dispatch_block(self, original):
        h, ctx, counters, guard = self.host, self.ctx, self.counters, self.guard

        @like(original)
        def dispatch_block(q, block, input_ids, input_others):
            device = torch.device(h.device_manager.device)
            if len(h.device_manager.device_list) > 1:
                reason = "several devices (AutoRound may spread the block over them)"
            else:
                reason = self._not_a_gpu(device, device)
            if reason:
                counters.host("block_dispatch", reason)
                return original(q, block, input_ids, input_others)

            def commit(moved):  # what AutoRound's one-device dispatch leaves on the quantizer
                q._card_0_in_high_risk, q._loss_device = False, device
                return moved
            return guard.attempt("block_dispatch", lambda: ctx.move_module_to_device(block, device),
                                 lambda: original(q, block, input_ids, input_others), commit)
        return dispatch_block

    # -- the plan --------------------------------------------------------------------------

    def _devices(self):
        """(visible devices, home, {device: free bytes}, whether home is an accelerator)."""
        info = {d.index: d.free_bytes for d in self.ctx.devices()}
        if self.ctx.host_memory:  # the CPU backend's virtual devices stand in for GPUs
            return sorted(info), 0, info, True
        visible = [d for d in sorted(info) if d < torch.cuda.device_count()]
        home = torch.device(self.host.device_manager.device)
        if home.type != "cuda":
            return [str(home)] + visible, str(home), info, False
        return visible, torch.cuda.current_device() if home.index is None else home.index, info, True

    def plan(self, name, iters, batch_size, block, mirror_parts):
        devices, home, free, accelerator = self._devices()
        holders = {str(t.device) for t in list(block.parameters()) + list(block.buffers())}
        plan = resolve_plan(self.parallel, devices, iters, batch_size, home=home, free_bytes=free,
                            mirror_parts=mirror_parts, home_is_accelerator=accelerator, block_devices=holders)
        self.plans.append((name, plan))
        if plan.world < 2 and self.parallel != "off":
            said = "; ".join(plan.left_out)
            if said not in self._said:
                self._said.add(said)
                log.warning("qlink: parallel_quantization=%s runs on one device: %s", self.parallel, said)
        return plan

    def placement(self, plan):
        if plan.devices not in self._placements:
            self._placements[plan.devices] = Placement(list(plan.devices), ctx=self.ctx)
        return self._placements[plan.devices]

    # -- block tuning ------------------------------------------------------------------------

    def _serial_reason(self, q, active_inputs, block_ctx, input_ids):
        """Why this block's tuning stays AutoRound's serial loop, or None."""
        last_block = getattr(block_ctx, "block_index", 0) == getattr(block_ctx, "block_cnt", 0) - 1
        checks = [
            (type(q) is not self.host.SignRoundQuantizer, "a SignRoundQuantizer subclass (%s)" % type(q).__name__),
            (not isinstance(active_inputs, list), "calibration inputs that are not a list of tensors (diffusion)"),
            (bool(q.enable_alg_ext) and str(q.scheme.data_type).endswith("dq"), "enable_alg_ext on a dq data type"),
            (bool(q.enable_lfq) and input_ids is not None and last_block,
             "enable_lfq (an lm_head loss) on the last block"),
            (q.lr_scheduler is not None, "a custom lr_scheduler (bound to one optimizer)"),
            (bool(getattr(q.config, "is_act_nv_fp", False)), "NVFP activation quantization"),
            (torch.distributed.is_available() and torch.distributed.is_initialized(),
             "torch.distributed is initialized (AutoRound's own DDP)"),
        ]
        return next((reason for failed, reason in checks if failed), None)

    def _make_quantize_block(self, original):
        @like(original)
        def quantize_block(q, block, fp_inputs, input_others, fp_outputs, q_inputs, block_ctx, input_ids=None,
                           **kwargs):
            args = (block, fp_inputs, input_others, fp_outputs, q_inputs, block_ctx)
            active = q_inputs if (q_inputs is not None and q.enable_quanted_input) else fp_inputs
            reason = self._serial_reason(q, active, block_ctx, input_ids)
            if reason:
                self.counters.host("quantize_block", reason)
                return original(q, *args, input_ids=input_ids, **kwargs)
            batch = min(len(active), q.calibration_context.batch_size * q.gradient_accumulate_steps)
            linears = _quantized_linears(block)
            parts = {"block": _nbytes(list(block.parameters()) + list(block.buffers())),
                     "tuning": sum(4 * m.weight.numel() * 5 // 4 for m in linears),
                     "activations (estimate)": 16 * batch * _nbytes(active[:1])}
            plan = self.plan(getattr(block_ctx, "block_name", ""), q.iters, batch, block, parts)
            if plan.world < 2:
                if self.parallel == "off":
                    self.counters.host("quantize_block", "parallel_quantization=off")
                    return original(q, *args, input_ids=input_ids, **kwargs)
                return self._tune_native(q, original, args, active, input_ids, kwargs)
            op = "sign" if q.optimizer is self.host.SignSGD and not q.momentum else "sum"
            placement = self.placement(plan)
            # The mirrors are qlink's alone: if they fail, AutoRound's serial loop runs on an
            # untouched block. Once the tuning starts (it wraps the block, AutoRound's
            # callbacks run) whatever fails propagates, never a second run of the block.
            return self.guard.attempt(
                "quantize_block", lambda: make_mirrors(self.ctx, placement, block),
                lambda: original(q, *args, input_ids=input_ids, **kwargs),
                lambda mirrors: tune_block(q, self.host, self.ctx, placement, mirrors, op, self.transport,
                                           self.check_replicas, *args, input_ids=input_ids, **kwargs))
        return quantize_block

    def _tune_native(self, q, original, args, active, input_ids, kwargs):
        """The block on qlink's native loop (autoround_native.py): nothing of the host's
        changes until the tuning is done (a failure before runs AutoRound's own loop on the
        untouched block, or raises under strict); then AutoRound's wrappers write the best
        parameters' weights."""
        h = self.host
        block, _, input_others, fp_outputs, _, block_ctx = args
        mask = None
        if input_ids is not None:  # as AutoRound's quantize_block derives it, cached on the quantizer
            if not hasattr(q, "_cached_valid_token_mask"):
                q._cached_valid_token_mask = q._compute_valid_token_mask(input_ids)
            mask = q._cached_valid_token_mask
        device = h.device_manager.device
        reason = unsupported(q, h, block, active, device)
        if reason:
            self.counters.host("quantize_block", reason)
            return original(q, *args, input_ids=input_ids, **kwargs)
        qlink_device = 0 if self.ctx.host_memory else None
        name = getattr(block_ctx, "block_name", "")

        def tune():
            layers = check(h, block, device)  # refused before anything is allocated
            sampler_state = random.getstate()  # AutoRound's sampler shuffles with `random`
            try:
                tuning = NativeTuning(q, h, self.ctx, block, layers, active, fp_outputs, input_others, mask,
                                      device, qlink_device)
                self.counters.record("compiled_loss", tuning.loss_refusal)
                self.counters.record("v_step", tuning.v_step_refusal)
                return tuning.run(lambda why: self.counters.record("step_graph", why))
            except Exception:
                random.setstate(sampler_state)  # AutoRound's loop, if it runs instead, draws as it would have
                raise

        def commit(result):
            best_params, losses, best_iter, last_loss = result
            self.losses.append((name, losses))
            quantized, unquantized = q.wrapper_block(block, q.enable_minmax_tuning, q.enable_norm_bias_tuning,
                                                     enable_torch_compile=q.compress_context.enable_torch_compile,
                                                     device=device)
            finish_block(h, q, block, best_params, quantized, unquantized,
                         ", loss iter 0: %.6f -> iter %d: %.6f" % (losses[0], best_iter, last_loss))
            return best_params

        return self.guard.attempt("quantize_block", tune, lambda: original(q, *args, input_ids=input_ids, **kwargs),
                                  commit)

    # -- iters=0 ------------------------------------------------------------------------------

    def _make_rtn_quantize_block(self, original):
        @like(original)
        def quantize_block(q, block, *args, **kwargs):
            linears = _quantized_linears(block)
            parts = {"largest layer": 4 * max((_nbytes([m.weight]) for m in linears), default=0)}
            block_ctx = kwargs.get("block_ctx", args[4] if len(args) > 4 else None)
            plan = self.plan(getattr(block_ctx, "block_name", ""), 0, 1, block, parts)
            if plan.world < 2 or len(linears) < 2:
                self.counters.host("rtn_layers", "; ".join(plan.left_out) or "a block of one layer")
                return original(q, block, *args, **kwargs)
            deferred = []  # AutoRound's own loop picks the layers; they run spread out below
            q._quantize_layer_via_rtn = lambda layer, disable_opt_rtn=None: deferred.append((layer, disable_opt_rtn))
            try:
                result = original(q, block, *args, **kwargs)
            finally:
                del q._quantize_layer_via_rtn
            self._spread_layers(q, deferred, self.placement(plan))
            self.counters.qlink("rtn_layers")
            return result
        return quantize_block

    def _spread_layers(self, q, deferred, placement):
        """Each deferred layer quantized by AutoRound's own _quantize_layer_via_rtn on one of
        the devices (largest layers first, each to the least loaded device), those away from
        home moved there by qlink and back once done."""
        loads, work = [0] * placement.world, [[] for _ in range(placement.world)]
        for layer, option in sorted(deferred, key=lambda item: -item[0].weight.numel()):
            rank = loads.index(min(loads))
            loads[rank] += layer.weight.numel()
            work[rank].append((layer, option))
        home = placement.torch_devices[0]

        def run(rank):
            device = placement.torch_devices[rank]
            for layer, option in work[rank]:
                away = rank > 0 and not placement.cpu
                if away:
                    self.ctx.move_module_to_device(layer, device)
                    move_tensor_attributes(self.ctx, layer, device)
                    layer.tuning_device = device
                q._quantize_layer_via_rtn(layer, disable_opt_rtn=option)
                if away:
                    vars(layer).pop("tuning_device", None)
                    done = self.host.get_module(q.model, layer.global_name)
                    self.ctx.move_module_to_device(done, home)
                    move_tensor_attributes(self.ctx, done, home)
        run_on_replicas(placement, run, "the RTN of its layers")


def install(parallel_quantization="auto", strict=False, *, config=None, ctx=None, library=None, transport="fp32",
            check_replicas=False):
    """Makes this process's AutoRound tune blocks data-parallel (see the module's docstring);
    a second install replaces the first.

    parallel_quantization: "auto", an int N, or "off" (AutoRound's own serial code).
    config: the qlink context's config, made the process default context; or ctx: a
    context to use instead. transport: "fp32" or "bf16" for the gradient exchange.
    check_replicas: compare every replica's tuning parameters with home's after each step
    (ReplicaDiverged if they differ; a test aid, it synchronizes every step). strict: a
    block whose replicas qlink fails to make raises FallbackRefused instead of running
    AutoRound's serial loop. AutoRound's version is checked against HOST's (another warns
    once; UnsupportedHost under strict) and every name the patches touch must be where
    HOST says (HostChanged naming each that moved); nothing is patched otherwise."""
    uninstall()
    return _integration.install(_Installation(ctx or configure(config, library), strict, parallel_quantization,
                                              transport, check_replicas)).ctx


def uninstall():
    """Restores AutoRound's own quantize_block methods where they are still qlink's;
    returns what it left (Integration.uninstall)."""
    return _integration.uninstall()


def counters():
    """Per patch: blocks run through qlink, run serial ("host") and why ({} when not
    installed)."""
    return _integration.counters()


def losses():
    """(block name, each iteration's loss) for every block the native loop tuned since
    install(), in order."""
    return list(_integration.current.losses) if _integration.current is not None else []


def plans():
    """(block name, qlink.plan.Plan) for every block seen since install(), in order."""
    return list(_integration.current.plans) if _integration.current is not None else []
