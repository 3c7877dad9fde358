"""GPTQModel through qlink:

    import qlink.integrations.gptqmodel as qlink_gptqmodel
    qlink_gptqmodel.install({"mode": "auto"})     # a P2PConfig, a dict of its fields, or a whole config
    ... GPTQModel.load(...).quantize(...) as usual ...
    qlink_gptqmodel.counters()                     # what ran through qlink, what did not and why

What install() routes through qlink (each a patch with its own counters):
  clone_module_for_devices  replicas of a layer for the forward workers, {device: replica} in
                            device order (every binding: looper_helpers, the modules that
                            imported it, ForwardExecutor.run_parallel's default argument)
  torch_replicate           the replicas themselves: qlink's broadcast, not
                            torch.nn.parallel.replicate (broadcast_coalesced)
  layer_prefetch            GPTQModel's lazy model fill (LazyTurtle.materialize_submodule): each
                            numbered layer's fill, once done, reads the next one's checkpoint
                            tensors on a helper thread, page-locked on a GPU, so that layer's
                            fill copies them without blocking (gptqmodel_prefetch)
  module_refill             the fills of that layer's own modules (GPTQModel fills each linear
                            again before replaying its forwards): copies, device to device, of
                            the layer's tensors read ahead, kept on its device until the next
                            layer's fill or the loop's end (gptqmodel_prefetch)
  cache_inputs              the calibration cache GPTQModel's input capture returns, moved
                            once to the one GPU the layers run on (gptqmodel_cache), so the
                            forwards' moves of its tensors find them there
  move_to, nested_move_to   tensor, module and calibration-batch moves (in every module that
                            imported them by name); host tensors go to the GPU through pinned
                            twins on the device's current stream, no thread blocked
                            (qlink/host_staging.py), the calibration cache's twins kept for
                            the next subset's and layer's moves of the same bytes;
                            staging_counters() says how many copies and twins
  add_batch                 the per-batch Hessian through qlink.quant.HessianAccumulator
                            (gptqmodel_hessian): stream-ordered, no synchronization, one
                            accumulation for the layers reading one input (q/k/v, gate/up),
                            a forward's calls queued and made as one native call (an MoE
                            layer's experts together); hessian_counters() says how many ran,
                            how many were shared, in how many calls
  materialize_global_hessian  the Hessian partials summed in device order by qlink.reduce, so
                            the result no longer depends on the order they arrived in
  rehome_processor_task     a module's task state moved to its device before each subset's
                            forwards: the quantizer's buffers (host scalars at first) through
                            qlink's moves, before GPTQModel's Module.to finds them there, so the
                            main thread no longer waits behind the queued Hessians for three
                            pageable copies
  quantize                  GPTQ.quantize through qlink's native GPTQ engine where it covers
                            the layer's options (gptqmodel_solve.unsupported), GPTQModel's own
                            solve otherwise; a subset's first solve takes every task of the
                            subset the engine covers with the same options in one engine call
                            (gptqmodel_solve_ahead: an MoE layer's experts together, spread
                            over every GPU where there are several), the others' calls
                            answered from it; solve_counters() says how many
  routed_experts            defuser's loop over a split MoE block's routed experts (where
                            defuser is installed): one host read per forward instead of one
                            per expert, the same output; in grouped forwards each expert's
                            rows sample by sample, their counts told to add_batch
                            (gptqmodel_routed), so MoE models group their batches too
  pack                      the finalizers' packing of a quantized layer into its int32
                            words (pack_block's slot for a native packer) on the GPU by
                            qlink.quant.gptq_pack (gptqmodel_pack): what GPTQModel's CPU packer
                            makes, bit for bit, without its per-32-column Python loop under the
                            layer's lock; GPTQModel's own packer for words of another width
  switch_interval           ModuleLooper.loop, the whole layer loop, with the interpreter's
                            switch interval shortened where install's switch_interval asks
                            (1e-4 s, say; the one before restored after): the main thread
                            takes the GIL back after each operator it launches without
                            waiting out the finalizer threads' Python (host_switch.py); off by
                            default (install's docstring says why)
  fixed_segments            ModuleLooper.loop with PyTorch's CUDA allocator making fixed
                            segments where the process asked for expandable ones (GPTQModel
                            does as it is imported), expandable ones back after: their growth
                            inside the forwards' allocations left the GPU idle (host_allocator.py)

GPTQModel swallows clone errors and falls back to deepcopy; with strict=True every patch
whose qlink path fails raises FallbackRefused instead of running the host's code."""
import contextlib
import importlib

import torch

from ..defaults import configure
from ..quant.hessian import HessianAccumulator
from . import gptqmodel_cache
from .base import HostSpec, Installation, Integration
from .gptqmodel_hessian import Queue, make_add_batch
from .gptqmodel_pack import make_pack
from .gptqmodel_prefetch import LayerPrefetch
from .gptqmodel_routed import make_run_routed_experts
from .gptqmodel_solve import done_with_hessian, unsupported
from .gptqmodel_solve_ahead import SolveAhead
from .host_allocator import fixed_segments
from .host_switch import check_interval, short_switch_interval
from .patches import like

PATCHES = ("clone_module_for_devices", "torch_replicate", "layer_prefetch", "module_refill", "cache_inputs",
           "group_batches", "move_to", "nested_move_to", "add_batch", "materialize_global_hessian",
           "rehome_processor_task", "quantize", "pack", "routed_experts", "switch_interval", "fixed_segments")

READ_AHEAD = ("pinned", "pageable", "off")
_HELPERS, _MODEL = "gptqmodel.utils.looper_helpers:", "gptqmodel.utils.model:"
_GPTQ = "gptqmodel.quantization.gptq:GPTQ."
_LOOPER = "gptqmodel.looper.module_looper:ModuleLooper"
_PACK = "gptqmodel.nn_modules.qlinear.pack_block_ext:pack_block_cpu"
_PACK_BLOCK = "gptqmodel.nn_modules.qlinear:PackableQuantLinear.pack_block"
_STRUCTURE = "gptqmodel.utils.structure:"
_ROUTED = "defuser.modeling.unfused_moe.common"  # GPTQModel's MoE splitter, where installed
# Every GPTQModel name the patches replace, call or read, GPTQ's task state included.
HOST = HostSpec("GPTQModel", "gptqmodel", "gptqmodel.version", "7.3", "f4c327a", [
    _HELPERS + "clone_module_for_devices", _HELPERS + "torch_replicate", _HELPERS + "clear_non_picklable_state",
    _MODEL + "move_to", _MODEL + "nested_move_to",
    "gptqmodel.looper.forward_executor:ForwardExecutor.run_parallel",  # binds the clone as a default
    "gptqmodel.looper.module_looper:clone_module_for_devices",         # imports the helpers by name
    _LOOPER, _LOOPER + ".loop", _LOOPER + ".cache_inputs", _LOOPER + "._rehome_processor_task", _LOOPER + ".gptq_model",
    _LOOPER + ".processors",
    _LOOPER + ".support_batch_quantize", _LOOPER + ".moe_routing_override", _LOOPER + ".moe_routing_bypass",
    "gptqmodel.looper.gptq_processor:GPTQProcessor", "gptqmodel.models.base:BaseQModel",
    "gptqmodel.models.base:BaseQModel.dynamic_expert_index",
    "gptqmodel.models.base:BaseQModel.prepare_layer_replay_kwargs",
    "gptqmodel.models.base:BaseQModel.update_layer_replay_kwargs_from_output",
    "gptqmodel.looper.input_cache:InputCache",
    "gptqmodel.quantization.gptq:GPTQ", "gptqmodel.quantization.quantizer:Quantizer",
    "gptqmodel.quantization.quantizer:Quantizer.requires_groupwise_processing",
    "gptqmodel.quantization.quantizer:Quantizer.perchannel", "gptqmodel.utils.fallback:should_use_fallback",
    _PACK, "gptqmodel.nn_modules.qlinear:PackableQuantLinear", _PACK_BLOCK,
    _STRUCTURE + "safe_open", _STRUCTURE + "_get_qualified_name", _STRUCTURE + "LazyTurtle.materialize_submodule",
    _STRUCTURE + "LazyTurtle._resolve_checkpoint_module_path", _STRUCTURE + "LazyTurtle._weight_map",
    _STRUCTURE + "LazyTurtle.model_local_path",
] + [_GPTQ + name for name in (
    "quantize", "add_batch", "materialize_global_hessian", "finalize_hessian", "_select_hessian_target_device", "lock",
    "H", "nsamples", "columns", "name", "qcfg", "module", "quantizer", "module_copy", "fallback", "expected_nsamples",
    "_tp_pad_cols", "fwd_counter", "_device_hessian_partials", "_device_sample_counts", "_hessian_dirty",
    "_final_hessian_device_hint")])

_integration = Integration()


class _Host:
    """The GPTQModel modules and originals the patches use."""

    def __init__(self, names):
        self.helpers = importlib.import_module("gptqmodel.utils.looper_helpers")
        self.GPTQ = names["gptqmodel.quantization.gptq:GPTQ"]
        self.Quantizer = names["gptqmodel.quantization.quantizer:Quantizer"]
        self.should_use_fallback = names["gptqmodel.utils.fallback:should_use_fallback"]
        self.ModuleLooper, self.cache_inputs = names[_LOOPER], names[_LOOPER + ".cache_inputs"]
        self.loop = names[_LOOPER + ".loop"]
        self.rehome_processor_task = names[_LOOPER + "._rehome_processor_task"]
        self.GPTQProcessor = names["gptqmodel.looper.gptq_processor:GPTQProcessor"]
        self.BaseQModel = names["gptqmodel.models.base:BaseQModel"]
        for name in ("clone_module_for_devices", "torch_replicate"):
            setattr(self, name, names[_HELPERS + name])
        for name in ("move_to", "nested_move_to"):
            setattr(self, name, names[_MODEL + name])
        for name in ("add_batch", "materialize_global_hessian", "quantize"):
            setattr(self, name, names[_GPTQ + name])
        self.pack_block_ext, self.pack_block_cpu = importlib.import_module(_PACK.split(":")[0]), names[_PACK]
        self.PackableQuantLinear = names["gptqmodel.nn_modules.qlinear:PackableQuantLinear"]
        self.pack_block = names[_PACK_BLOCK]
        self.structure = importlib.import_module(_STRUCTURE[:-1])
        self.LazyTurtle = self.structure.LazyTurtle
        self.materialize_submodule = names[_STRUCTURE + "LazyTurtle.materialize_submodule"]
        self.qualified_name = names[_STRUCTURE + "_get_qualified_name"]
        self.safe_open = names[_STRUCTURE + "safe_open"]
        try:
            self.run_routed_experts = importlib.import_module(_ROUTED).run_routed_experts
        except (ImportError, AttributeError):
            self.run_routed_experts = None


def _device_order(device):
    device = torch.device(device)
    return device.type, -1 if device.index is None else device.index


def _has_meta(module):
    return any(t.is_meta for t in list(module.parameters()) + list(module.buffers()))


class _Installation(Installation):
    PATCHES, HOST = PATCHES, HOST

    def __init__(self, ctx, strict, read_ahead="pinned", switch_interval=None, fixed_segments=True):
        if read_ahead not in READ_AHEAD:
            raise ValueError("read_ahead must be one of %s, got %r" % (READ_AHEAD, read_ahead))
        if not isinstance(fixed_segments, bool):
            raise ValueError("fixed_segments must be True or False, got %r" % (fixed_segments,))
        self.switch_interval = check_interval(switch_interval)
        self.fixed_segments = fixed_segments
        super().__init__(ctx, strict)
        self.host = _Host(self.names)
        self.read_ahead = read_ahead
        self.accumulator = HessianAccumulator(ctx)
        self.queue = Queue(self)  # add_batch's calls of a forward, made as one native call
        self.ahead = SolveAhead(self)  # a subset's tasks solved in one engine call
        pin = read_ahead == "pinned" and not ctx.host_memory and torch.cuda.is_available()
        self.prefetch = LayerPrefetch(self.host.safe_open, pin, self.counters, self.guard)
        # Each sample's tokens where the loop's cache holds grouped one-sample batches
        # (group_batches), None where its batches are GPTQModel's.
        self.sample_tokens = None

    def close(self):
        try:
            self.queue.flush()
        finally:
            self.prefetch.close()

    def apply(self):
        h, bind = self.host, self.rebindings
        for name in ("clone_module_for_devices", "torch_replicate", "move_to", "nested_move_to"):
            bind.everywhere(getattr(h, name), getattr(self, "_make_" + name)(), "gptqmodel")
        if self.read_ahead != "off":
            bind.set(h.structure, "safe_open", self.prefetch.make_safe_open())
            bind.set(h.LazyTurtle, "materialize_submodule",
                     self.prefetch.make_materialize_submodule(h.materialize_submodule, h.qualified_name))
        bind.set(h.ModuleLooper, "loop", self._make_loop())
        bind.set(h.ModuleLooper, "cache_inputs", self._make_cache_inputs())
        bind.set(h.ModuleLooper, "_rehome_processor_task", self._make_rehome_processor_task())
        bind.set(h.GPTQ, "add_batch", make_add_batch(self))
        bind.set(h.GPTQ, "materialize_global_hessian", self._make_materialize_global_hessian())
        bind.set(h.GPTQ, "quantize", self._make_quantize())
        pack_block_cpu, pack_block = make_pack(self)
        bind.set(h.pack_block_ext, "pack_block_cpu", pack_block_cpu)
        bind.set(h.PackableQuantLinear, "pack_block", pack_block)
        if h.run_routed_experts is not None:
            bind.everywhere(h.run_routed_experts, make_run_routed_experts(self), "defuser")

    @property
    def grouped(self):
        """Whether the loop's forwards hold several one-sample batches (group_batches)."""
        return self.sample_tokens is not None

    def samples_in(self, tokens):
        """How many of the loop's samples a forward of `tokens` rows holds: more than one
        only in grouped forwards."""
        if self.grouped and tokens % self.sample_tokens == 0:
            return tokens // self.sample_tokens
        return 1

    def _make_loop(self):
        original, counters = self.host.loop, self.counters
        seconds, fixed = self.switch_interval, self.fixed_segments

        @like(original)
        def loop(looper, *args, **kwargs):
            with contextlib.ExitStack() as settings:
                settings.callback(self.prefetch.forget)  # the last layer's copies for its modules' fills
                if seconds is None:
                    counters.host("switch_interval", "switch_interval=None")
                else:
                    counters.record("switch_interval", settings.enter_context(short_switch_interval(seconds)))
                if fixed:
                    counters.record("fixed_segments", settings.enter_context(fixed_segments()))
                else:
                    counters.host("fixed_segments", "fixed_segments=False")
                return original(looper, *args, **kwargs)
        return loop

    # -- replicas ------------------------------------------------------------------------

    def _make_torch_replicate(self):
        original, ctx, guard = self.host.torch_replicate, self.ctx, self.guard

        @like(original)
        def torch_replicate(module, devices, detach=True):
            return guard.attempt("torch_replicate",
                                 lambda: list(ctx.clone_module_for_devices(module, devices).values()),
                                 lambda: original(module, devices, detach=detach))
        return torch_replicate

    def _make_clone_module_for_devices(self):
        h, counters = self.host, self.counters
        original = h.clone_module_for_devices

        @like(original)
        def clone_module_for_devices(module, devices, *, clear_state_fn=None, progress_callback=None):
            clear = clear_state_fn or h.helpers.clear_non_picklable_state

            def host():
                return original(module, devices, clear_state_fn=clear, progress_callback=progress_callback)

            if not devices or all(torch.device(d).type == "cpu" for d in devices):
                counters.host("clone_module_for_devices", "host devices: P2P is an accelerator concept")
                return host()

            def notify(index, device, step):  # GPTQModel ignores a failing progress callback
                try:
                    if progress_callback is not None:
                        progress_callback(index, len(devices), device, step)
                except Exception:  # noqa: BLE001
                    pass

            # GPTQModel's steps, in its order. Its callbacks (clear) run once each and what
            # they raise is theirs; the replicas are the one step of qlink's, through the
            # host's torch_replicate binding (the patch below: qlink's replicas, or the
            # host's replicate if qlink's fail, before anything else is redone).
            module.eval()
            clear(module)
            notify(0, devices[0], "stage")
            replicas, out = h.helpers.torch_replicate(module, devices), {}
            for i, (device, replica) in enumerate(zip(devices, replicas), start=1):
                replica.eval()
                clear(replica)
                replica._gptqmodule_device_hint = device
                out[device] = replica
                notify(i, device, "replica")
            counters.qlink("clone_module_for_devices")
            return out
        return clone_module_for_devices

    # -- moves ---------------------------------------------------------------------------

    def _make_cache_inputs(self):
        h, ctx, counters, guard = self.host, self.ctx, self.counters, self.guard
        original = h.cache_inputs

        @like(original)
        def cache_inputs(looper, *args, **kwargs):
            cache = original(looper, *args, **kwargs)
            layers = kwargs["layers"] if "layers" in kwargs else (args[0] if args else None)
            # The host's cache is kept if a step fails: its capture ran once.
            device, reason = gptqmodel_cache.placement(ctx, looper.gptq_model.quantize_config.device, cache)
            if reason:
                counters.host("cache_inputs", reason)
            else:
                moved = cache
                cache = guard.attempt("cache_inputs", lambda: gptqmodel_cache.on_device(moved, device), lambda: moved)
            self.sample_tokens, plan = None, None
            reason = gptqmodel_cache.grouping_refusal(looper, layers, h, h.run_routed_experts is not None)
            if reason is None:
                plan, reason = gptqmodel_cache.grouping_plan(cache)
            if reason:
                counters.host("group_batches", reason)
                return cache

            def commit(grouped):
                # add_batch: each hook input is one sample per row of dim 0, or flattened to
                # its samples' tokens, each sample as many tokens as every other (grouping_plan)
                first = cache.layer_inputs[0][0]
                self.sample_tokens = first.numel() // first.shape[-1]
                return grouped
            return guard.attempt("group_batches", lambda: gptqmodel_cache.grouped(cache, plan), lambda: cache, commit)
        return cache_inputs

    def _make_move_to(self):
        original, ctx, counters, guard = self.host.move_to, self.ctx, self.counters, self.guard

        @like(original)
        def move_to(obj, device, dtype=None):
            if dtype is not None:
                reason = "a dtype conversion"
            elif device is None:
                reason = "no device"
            elif isinstance(obj, torch.nn.Module):
                reason = "meta (offloaded) tensors" if _has_meta(obj) else None
            else:
                reason = None if isinstance(obj, torch.Tensor) else "a %s, not a tensor" % type(obj).__name__
            if reason:
                counters.host("move_to", reason)
                return original(obj, device, dtype)
            if isinstance(obj, torch.nn.Module):  # changed only once every tensor has arrived (moves.py)
                return guard.attempt("move_to", lambda: ctx.move_module_to_device(obj, device),
                                     lambda: original(obj, device, dtype))
            # A tensor moved alone is calibration data (masks, position ids): moved again
            # for every subset of every layer, so its pinned twin is kept.
            return guard.attempt("move_to", lambda: ctx.move_tensors([obj], device, keep_host_copies=True)[0],
                                 lambda: original(obj, device, dtype))
        return move_to

    def _make_rehome_processor_task(self):
        original, ctx, counters, guard = self.host.rehome_processor_task, self.ctx, self.counters, self.guard

        @like(original)
        def _rehome_processor_task(looper, processor, named_module, target_device):
            task = (getattr(processor, "tasks", None) or {}).get(getattr(named_module, "name", None))
            quantizer = getattr(task, "quantizer", None)
            if not isinstance(quantizer, torch.nn.Module) or target_device is None:
                counters.host("rehome_processor_task", "no quantizer module" if target_device is not None
                              else "no device")
            elif _has_meta(quantizer):
                counters.host("rehome_processor_task", "meta (offloaded) tensors")
            else:  # GPTQModel's own moves below find the quantizer's tensors in place
                guard.attempt("rehome_processor_task", lambda: ctx.move_module_to_device(quantizer, target_device),
                              lambda: None)
            return original(looper, processor, named_module, target_device)
        return _rehome_processor_task

    def _make_nested_move_to(self):
        original, ctx, counters, guard = self.host.nested_move_to, self.ctx, self.counters, self.guard

        @like(original)
        def nested_move_to(v, device, dtype=None):
            if dtype is not None or device is None:
                counters.host("nested_move_to", "a dtype conversion" if dtype is not None else "no device")
                return original(v, device, dtype)
            return guard.attempt("nested_move_to",
                                 lambda: ctx.move_nested_to_device(v, device, keep_host_copies=True),
                                 lambda: original(v, device, dtype))
        return nested_move_to

    # -- Hessians and the solve ------------------------------------------------------------

    def _merge_refusal(self, partials, target):
        """Why qlink.reduce cannot merge these partials (sorted in device order) into
        `target`, or None."""
        tensors = [p for _, p in partials]
        if any(p.dtype != torch.float32 or not p.is_contiguous() for p in tensors):
            return "a partial that is not contiguous fp32"
        if self.ctx.host_memory:  # the CPU backend's virtual devices stand in for the partials' devices
            if len(tensors) > self.ctx.device_count or target.type != "cpu" or any(p.is_cuda for p in tensors):
                return "partials the %s backend's %d devices cannot hold" % (self.ctx.backend, self.ctx.device_count)
        elif target.type != "cuda" or not all(p.is_cuda for p in tensors):
            return "a partial or the merged Hessian in host memory"
        return None

    def _make_materialize_global_hessian(self):
        original, ctx, counters, guard = self.host.materialize_global_hessian, self.ctx, self.counters, self.guard
        patch = "materialize_global_hessian"

        @like(original)
        def materialize_global_hessian(gptq, target_device=None):
            self.queue.flush()  # the forward's last calls land before the partials are read
            with gptq.lock:
                # Device order for whichever sums them, so the merge no longer depends on the
                # order the partials arrived in.
                partials = sorted(gptq._device_hessian_partials.items(), key=lambda kv: _device_order(kv[0]))
                gptq._device_hessian_partials = dict(partials)
                total = sum(gptq._device_sample_counts.values())
                target = gptq._select_hessian_target_device(target_device)
                if not gptq._hessian_dirty or total == 0 or not partials:
                    reason = "nothing to merge"
                else:
                    reason = self._merge_refusal(partials, target)
                if reason is None:
                    def merge():
                        merged = torch.empty(gptq.columns, gptq.columns, dtype=torch.float32, device=target)
                        ids = list(range(len(partials))) if ctx.host_memory else None
                        ctx.reduce([p for _, p in partials], merged, 2.0 / total, input_devices=ids,
                                   output_device=0 if ids else None)
                        return merged

                    def commit(merged):
                        gptq.H, gptq.nsamples, gptq._hessian_dirty = merged, total, False
                        gptq._final_hessian_device_hint = merged.device
                        gptq._device_hessian_partials.clear()
                        gptq._device_sample_counts.clear()
                        return True

                    # A fallback is the host's merge below, once this lock is released.
                    if guard.attempt(patch, merge, lambda: False, commit):
                        return None
                else:
                    counters.host(patch, reason)
            return original(gptq, target_device)  # takes the lock itself
        return materialize_global_hessian

    def _make_quantize(self):
        original, counters, guard = self.host.quantize, self.counters, self.guard

        @like(original)
        def quantize(gptq, blocksize=128):
            self.queue.flush()  # the counts unsupported() reads include the forward's last calls
            reason = unsupported(gptq, self.host)
            if reason:
                counters.host("quantize", reason)
                return original(gptq, blocksize)
            # GPTQModel's solve starts by merging the Hessian; merged here once, outside the
            # guard (what the host's merge raises is its own), the host's solve finds it
            # merged if qlink's fails (GPTQModel's merge returns at once when nothing is new).
            gptq.finalize_hessian(target_device=getattr(gptq.module, "target_device", None))
            return guard.attempt("quantize", lambda: self.ahead.result_for(gptq), lambda: original(gptq, blocksize),
                                 commit=lambda result: done_with_hessian(gptq, result))
        return quantize


def install(config=None, strict=False, *, ctx=None, library=None, read_ahead="pinned", switch_interval=None,
            fixed_segments=True):
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
    for the layer loop, or None (the default) to leave it: one profiled run with it solved
    a layer a few units in the last place apart from every other run, unexplained (every
    run since agrees), so it is asked for rather than assumed.
    fixed_segments: True (the default) runs the layer loop with PyTorch's CUDA allocator
    making fixed segments where the process asked for expandable ones (GPTQModel asks as it
    is imported; host_allocator.py says what that cost); False leaves the allocator as set.
    GPTQModel's version is checked against HOST's (another warns once; UnsupportedHost
    under strict) and every name the patches touch must be where HOST says (HostChanged
    naming each that moved); nothing is patched otherwise."""
    uninstall()
    return _integration.install(_Installation(ctx or configure(config, library), strict, read_ahead,
                                              switch_interval, fixed_segments)).ctx


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


def hessian_counters():
    """The add_batch patch's accumulations: {"accumulations": run, "shared": answered by one
    already run, "rows": accumulated, "calls": native calls made} ({} when not installed)."""
    current = _integration.current
    return current.accumulator.counters() if current is not None else {}


def solve_counters():
    """The quantize patch's engine calls: {"calls": made, "layers": solved in them, "ahead":
    answered from a sibling's call, "refused": batches the engine refused, each task then
    solved alone, "spread": calls run over every device of the context} ({} when not
    installed)."""
    current = _integration.current
    return current.ahead.counters() if current is not None else {}


def staging_counters():
    """The moves' host staging (qlink.host_staging.HostStaging.counters: copies, twins made,
    reused and refreshed, bytes) ({} when not installed)."""
    current = _integration.current
    return current.ctx.host_staging.counters() if current is not None else {}


def counters():
    """Per patch, how many calls ran through qlink, through the host by design ("host") or
    after qlink failed ("fallback"), and why ({} when not installed)."""
    return _integration.counters()
