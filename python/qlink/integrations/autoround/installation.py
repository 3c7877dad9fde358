"""One installation of qlink in AutoRound: the host names it resolved (_Host), the
replacements its seams bind (the _make_* methods), the plan per block and the losses of
the native loop."""
import importlib
import logging
import random
import threading

import torch

from ...moves import has_meta, nbytes
from ...pinned_staging import stageable
from ...plan import check_setting, resolve_plan
from ...quant.placement import Placement
from ...streams import resolved_device
from ..base import Installation
from ..patches import like
from ..process_settings import frozen_gc
from . import grouped_unwrap
from .contract import dispatched, global_batch_size, plain_rtn, valid_token_mask, wrapped_layers
from .native_loop import NativeTuning, check, unsupported
from .parallel_tuning import finish_block, make_mirrors, move_tensor_attributes, run_on_replicas, tune_block

TRANSPORTS = ("fp32", "bf16")
log = logging.getLogger("qlink")
_SIGN_ROUND = "auto_round.algorithms.quantization.sign_round.quantizer:SignRoundQuantizer"
_RTN = "auto_round.algorithms.quantization.rtn.quantizer:"
_ORCHESTRATOR = "auto_round.compressors.orchestrator:CompressionOrchestrator"
_INPUTS = "auto_round.calibration.inputs:"
_BASE = "auto_round.algorithms.quantization.base:BaseQuantizer"


class _Host:
    """The AutoRound classes and functions the patches use."""

    def __init__(self, names):
        self.SignRoundQuantizer = names[_SIGN_ROUND]
        self.CompressionOrchestrator = names[_ORCHESTRATOR]
        self.RTNQuantizer = names[_RTN + "RTNQuantizer"]
        self.OptimizedRTNQuantizer = names[_RTN + "OptimizedRTNQuantizer"]
        self.inputs, self.inputs_to_device = importlib.import_module(_INPUTS[:-1]), names[_INPUTS + "to_device"]
        for name in names:
            short = name.rpartition(":")[2]
            if "." not in short and not hasattr(self, short):
                setattr(self, short, names[name])


def _one_per_sample(value):
    """Whether `value` is a list of CPU tensors of one shape and dtype, each stageable
    (AutoRound's per-sample cache of a block's first input)."""
    return (isinstance(value, list) and len(value) > 1 and all(stageable(t) is None for t in value)
            and len({(tuple(t.shape), t.dtype) for t in value}) == 1)


def _quantized_linears(block):
    return [m for m in block.modules() if isinstance(m, torch.nn.Linear) and getattr(m, "bits", 16) <= 8]


class AutoRoundInstallation(Installation):
    def __init__(self, ctx, strict, seams, host_spec, parallel, transport, check_replicas, grouped_moe):
        check_setting(parallel)
        if transport not in TRANSPORTS:
            raise ValueError("transport must be one of %s, got %r" % (TRANSPORTS, transport))
        if grouped_moe not in (True, False):
            raise ValueError("grouped_moe must be True or False, got %r" % (grouped_moe,))
        self.grouped_moe = grouped_moe
        self.closed = False  # uninstalled: a replacement the host still holds defers to the host's own
        super().__init__(ctx, strict, seams, host_spec)
        self.parallel, self.transport, self.check_replicas = parallel, transport, check_replicas
        self.host = _Host(self.names)
        self.plans = []         # (block name, Plan), in the order the blocks came
        self._placements = {}   # devices -> Placement (its worker threads kept between blocks)
        self._said = set()      # serial reasons already logged
        self.losses = []        # (block name, each iteration's loss) of the native loop
        self._deferring = threading.local()  # (quantizer, [(layer, option)]) while a block's RTN picks layers

    def close(self):
        self.closed = True

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
                    # emptied the allocator's cache, an allocation each cost more than the
                    # copies (docs/HOSTS.md).
                    rows = torch.empty((len(input),) + tuple(input[0].shape), dtype=input[0].dtype, device=target)
                    return ctx.pinned_staging.to_device(input, target, into=list(rows.unbind(0)))
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
        if self.ctx.cpu_memory or target is None or target.type != "cuda":
            return "not a GPU of a GPU backend (%s, %s)" % (asked, self.ctx.backend)
        return None

    def _make_dispatch_block(self, original):
        """SignRound's dispatch: the block to the tuning GPU through qlink's moves where AutoRound
        would not spread it over several devices, the quantizer's loss device set as it sets it."""
        return self._dispatch_through_moves(original, sign_round=True)

    def _make_base_dispatch_block(self, original):
        """BaseQuantizer's dispatch (the RTN quantizers' at iters=0): the block to the primary
        device through qlink's moves, whatever the device count (it never spreads a block)."""
        return self._dispatch_through_moves(original, sign_round=False)

    def _dispatch_through_moves(self, original, sign_round):
        """A quantizer's dispatch_block moving the block with ctx.move_module_to_device where
        the primary device is a GPU of a GPU backend, AutoRound's own move otherwise (counted)."""
        h, ctx, counters, guard = self.host, self.ctx, self.counters, self.guard

        @like(original)
        def dispatch_block(q, block, input_ids, input_others):
            device = torch.device(h.device_manager.device)
            if sign_round and len(h.device_manager.device_list) > 1:
                reason = "several devices (AutoRound may spread the block over them)"
            else:
                reason = self._not_a_gpu(device, device)
            if reason:
                counters.host("block_dispatch", reason)
                return original(q, block, input_ids, input_others)

            def commit(moved):
                if sign_round:
                    dispatched(q, device)
                return moved
            return guard.attempt("block_dispatch", lambda: ctx.move_module_to_device(block, device),
                                 lambda: original(q, block, input_ids, input_others), commit)
        return dispatch_block

    def _make_module_from_gpu(self, original):
        """AutoRound's mv_module_from_gpu (a quantized block back to the CPU: Module.to's pageable
        copies, a wait each) through qlink's moves, streamed back into pageable memory, where
        the module holds no meta tensor, names no device of its own and none of its modules
        moves in its own way; AutoRound's own move otherwise (counted)."""
        ctx, counters, guard = self.ctx, self.counters, self.guard
        cpu = torch.device("cpu")

        @like(original)
        def mv_module_from_gpu(module):
            if hasattr(module, "device"):
                reason = "a module that names its own device"
            elif has_meta(module):
                reason = "meta tensors (AutoRound moves the others one by one)"
            else:
                own = (type(m).__name__ for m in module.modules()
                       if type(m).to is not torch.nn.Module.to or type(m)._apply is not torch.nn.Module._apply)
                reason = next(("a module of its own move (%s: to or _apply)" % name for name in own), None)
            if reason:
                counters.host("module_from_gpu", reason)
                return original(module)
            return guard.attempt("module_from_gpu", lambda: ctx.move_module_to_device(module, cpu, pageable=True),
                                 lambda: original(module))
        return mv_module_from_gpu

    # -- the plan --------------------------------------------------------------------------

    def _devices(self):
        """(visible devices, home, {device: free bytes}, whether home is an accelerator)."""
        info = {d.index: d.free_bytes for d in self.ctx.devices()}
        if self.ctx.cpu_memory:  # the CPU backend's virtual devices stand in for GPUs
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
            batch = global_batch_size(q, len(active))
            linears = _quantized_linears(block)
            parts = {"block": nbytes(list(block.parameters()) + list(block.buffers())),
                     "tuning": sum(4 * m.weight.numel() * 5 // 4 for m in linears),
                     "activations (estimate)": 16 * batch * nbytes(active[:1])}
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
        """The block on qlink's native loop (native_loop.py): nothing of the host's
        changes until the tuning is done (a failure before runs AutoRound's own loop on the
        untouched block, or raises under strict); then AutoRound's wrappers write the best
        parameters' weights."""
        h = self.host
        block, _, input_others, fp_outputs, _, block_ctx = args
        mask = valid_token_mask(q, input_ids)
        device = h.device_manager.device
        reason = unsupported(q, h, block, active, device)
        if reason:
            self.counters.host("quantize_block", reason)
            return original(q, *args, input_ids=input_ids, **kwargs)
        qlink_device = 0 if self.ctx.cpu_memory else None
        name = getattr(block_ctx, "block_name", "")

        def tune():
            layers = check(h, block, device)  # refused before anything is allocated
            sampler_state = random.getstate()  # AutoRound's sampler shuffles with `random`
            try:
                tuning = NativeTuning(q, h, self.ctx, block, layers, active, fp_outputs, input_others, mask,
                                      device, qlink_device)
                self.counters.record("compiled_loss", tuning.loss_refusal)
                self.counters.record("v_step", tuning.v_step_refusal)
                if tuning.has_experts:
                    self.counters.record("grouped_experts", tuning.experts_refusal)
                return tuning.run(lambda why: self.counters.record("step_graph", why)), tuning.best_on_device()
            except Exception:
                random.setstate(sampler_state)  # AutoRound's loop, if it runs instead, draws as it would have
                raise

        def commit(result):
            (best_params, losses, best_iter, last_loss), on_device = result
            self.losses.append((name, losses))
            quantized, unquantized = self._wrap_block(q, block, on_device if best_params else {}, device)
            finish_block(h, q, block, best_params, quantized, unquantized,
                         ", loss iter 0: %.6f -> iter %d: %.6f" % (losses[0], best_iter, last_loss))
            return best_params

        return self.guard.attempt("quantize_block", tune, lambda: original(q, *args, input_ids=input_ids, **kwargs),
                                  commit)

    def _wrap_block(self, q, block, best, device):
        """AutoRound's wrapper_block of the tuned block, but for the layers grouped_unwrap
        stacks: those are unwrapped here with their best parameters (`best`: {name: {key:
        tensor}}, {} where the tuning kept none), so unwrapper_block finds only the others
        wrapped. Returns wrapper_block's (quantized names, unquantized names)."""
        h = self.host
        kwargs = dict(enable_minmax_tuning=q.enable_minmax_tuning, enable_norm_bias_tuning=q.enable_norm_bias_tuning,
                      enable_torch_compile=q.compress_context.enable_torch_compile, device=device)
        quantized, unquantized = wrapped_layers(h, block)
        done = self._unwrap_stacked([(n, m, resolved_device(device)) for n, m in quantized], best, lambda n: kwargs)
        for n, m in quantized:
            if n not in done:
                h.set_module(block, n, h.WrapperLinear(m, **kwargs))
        return [n for n, _ in quantized], unquantized

    def _unwrap_stacked(self, layers, best, kwargs_of):
        """AutoRound's unwrap of the layers ([(name, layer, device)]) grouped_unwrap stacks, a
        group a call, each with best.get(name) and WrapperLinear's kwargs_of(name); the names
        it unwrapped. The others (their reasons, or a group's failure, counted under
        "grouped_unwrap") are the caller's to unwrap one by one."""
        stacked, single = grouped_unwrap.groups(layers)
        for why in single.values():
            self.counters.host("grouped_unwrap", why)
        done = set()
        for members in stacked:
            names = [n for n, _ in members]
            if self.guard.attempt("grouped_unwrap", lambda: grouped_unwrap.unwrap(
                    self.host.WrapperLinear, [m for _, m in members], [best.get(n) for n in names],
                    **kwargs_of(names[0])) or True, lambda: False):
                done.update(names)
        return done

    # -- iters=0 ------------------------------------------------------------------------------

    def _make_rtn_quantize_block(self, original):
        @like(original)
        def quantize_block(q, block, *args, **kwargs):
            linears = _quantized_linears(block)
            parts = {"largest layer": 4 * max((nbytes([m.weight]) for m in linears), default=0)}
            block_ctx = kwargs.get("block_ctx", args[4] if len(args) > 4 else None)
            plan = self.plan(getattr(block_ctx, "block_name", ""), 0, 1, block, parts)
            if len(linears) < 2:
                self.counters.host("rtn_layers", "a block of one layer")
                return original(q, block, *args, **kwargs)
            deferred = []  # AutoRound's own loop picks the layers; they run below
            self._deferring.layers = (q, deferred)
            try:
                result = original(q, block, *args, **kwargs)
            finally:
                self._deferring.layers = None
            if plan.world < 2:
                self.counters.host("rtn_layers", "; ".join(plan.left_out))
                self._grouped_rtn(q, deferred)
            else:
                self._spread_layers(q, deferred, self.placement(plan))
                self.counters.qlink("rtn_layers")
            return result
        return quantize_block

    def _make_quantize_layer_via_rtn(self, original):
        @like(original)
        def _quantize_layer_via_rtn(q, layer, disable_opt_rtn=None):
            deferring = getattr(self._deferring, "layers", None)
            if deferring is not None and deferring[0] is q:
                deferring[1].append((layer, disable_opt_rtn))
                return None
            return original(q, layer, disable_opt_rtn=disable_opt_rtn)
        return _quantize_layer_via_rtn

    def _grouped_rtn(self, q, deferred):
        """The deferred layers' RTN on one device: those AutoRound quantizes by plain RTN
        unwrapped stacked by shape and options (_unwrap_stacked), the others (optimized RTN,
        a layer of a kind) by its own _quantize_layer_via_rtn, each in its turn."""
        plain, kwargs = [], {}
        for layer, option in deferred:
            rtn = plain_rtn(q, self.host, layer, option)
            if rtn is None:
                self.counters.host("grouped_unwrap", "optimized RTN (a scale search a layer)")
                continue
            kwargs[layer.global_name] = rtn[1]
            plain.append((layer.global_name, layer, resolved_device(rtn[0])))
        done = self._unwrap_stacked(plain, {}, kwargs.get)
        for layer, option in deferred:
            if layer.global_name not in done:
                q._quantize_layer_via_rtn(layer, disable_opt_rtn=option)

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
