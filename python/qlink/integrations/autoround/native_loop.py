"""AutoRound's block tuning (SignRoundQuantizer.quantize_block) on one device, on qlink's
native SignRound engine: the same iterations as AutoRound's loop with none of its
per-iteration host work.

- Every iteration's batch indices are drawn before the loop from AutoRound's own sampler
  (the same draws, the same consumption of Python's `random`), into one device table.
- The calibration inputs, the block's reference outputs, the per-sample entries of
  input_others and AutoRound's valid-token mask are stacked on the tuning device once; a
  batch is an index_select by the iteration's row of the table.
- The block runs unwrapped through AutoRound's own forward runner, its quantized linears'
  weights replaced for the call (functional_call) by the engine's quant-dequant of all of
  them at once (signround_qdq_layers: one engine call per options set forward, one
  backward); the loss is AutoRound's (_get_loss's arithmetic, on a GPU compiled into one
  kernel before the loop; _scale_loss_and_backward), each iteration's as AutoRound sums it
  (float64, over the batch's valid tokens with a mask).
- The step is the engine's SignSGD with AutoRound's learning-rate groups and LinearLR
  schedule; it keeps the best-loss parameters on the device itself. Where an iteration is
  one backward (gradient_accumulate_steps 1, the batch in one sub-batch), the rounding
  offsets take their step inside the quant-dequant's backward (VStep, ABI 1.9: their
  gradients, as large as the weights in fp32, never stored and read back), the range
  factors' step after it; otherwise every tensor's gradient, then one step (the
  installation's "v_step" counter says which and why).
- An MoE block's experts (AutoRound wraps each its own linear: "<...>.experts.<i>.<proj>")
  take their quant-dequant and its backward together, each projection's experts in one
  engine call per pass (signround_qdq_experts, ABI 1.10: one launch on a GPU), bit for bit
  what the per-layer calls make. Where one projection's experts differ (shape, dtype,
  options), the whole block's experts go layer by layer, the reason counted (the
  installation's "grouped_experts" counter). Such a block's step is one engine call of
  every tensor as one expert (signsgd_experts_step): one launch on a GPU, where
  signsgd_step launches once per tensor. The iterations'
  losses are written into a device tensor at the step counter's index: the host reads
  them once, after the loop.
- On a GPU the iteration (forward, backward, step) is captured once warm and replayed as
  a CUDA graph; where it cannot be (not a GPU, an iteration that reads the device from the
  host, a failed capture), it runs eagerly and the reason is counted (the installation's
  "step_graph" counter). The last warm-up iteration runs under PyTorch's sync debug mode:
  an iteration that waits on the device (an MoE block routed by AutoRound's loop: a nonzero
  per expert) is not captured, since the capture would fail there, part-way through.

Nothing the host can see changes until commit(): the block stays unwrapped, the tuning
state is qlink's own tensors. commit() unwraps the block with the best parameters through
AutoRound's own wrappers (its arithmetic writes the weights; same-shaped layers stacked, one
unwrap a group: grouped_unwrap), and logs AutoRound's summary line. check() refuses bad
input before anything is allocated, naming the layer and the field; unsupported() names the
options this loop does not cover (AutoRound's own loop runs those)."""
import collections
import contextlib
import functools
import re
import warnings

import torch

from ...quant.signround import (VStep, signround_qdq_experts, signround_qdq_layers, signsgd_experts_step,
                                signsgd_step)
from ...streams import resolved_device
from .contract import global_batch_size, learning_rates

try:
    from torch.func import functional_call
except ImportError:  # PyTorch < 2.0
    from torch.nn.utils.stateless import functional_call

BITS = (2, 3, 4, 8)
WARMUP = 3  # eager iterations before the capture: compiled code and autograd's state settle
_SCALE_DTYPES = {"fp16": torch.float16, "float16": torch.float16, "bf16": torch.bfloat16,
                 "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32}
_WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_EXPERT = re.compile(r"^(?:(.*)\.)?experts\.(\d+)\.(.+)$")  # "<moe>.experts.<i>.<proj>", as HF names them


def _masked_mse(pred, ref, mask, reduction):
    """AutoRound's _get_loss: the outputs times its 0/1 valid-token mask (exact), cast to
    fp32, their MSE."""
    if mask is not None:
        pred, ref = pred * mask, ref * mask
    return torch.nn.functional.mse_loss(pred.to(torch.float32), ref.to(torch.float32), reduction=reduction)


@functools.lru_cache(maxsize=None)
def _compiled_mse():
    # Eager, the loss is six passes over the batch's outputs; compiled, one
    # (bench/attention_mask_cost.py times both).
    return torch.compile(_masked_mse, dynamic=False)


def _as_words(rows, dim):
    """`rows` (samples stacked along dimension 0, contiguous) as one row of 8-byte words per
    sample, the same memory, or None where it is not that. A batch selected from the words
    is the same bytes as one selected from `rows`, moved 8 bytes a thread: PyTorch's
    index_select moves one element a thread (a bf16 batch of 8 x 2048 x 4096 at about
    1.2 TB/s on an H200)."""
    sample_bytes = rows[0].numel() * rows.element_size() if rows.dim() and len(rows) else 0
    if dim != 0 or not rows.is_contiguous() or sample_bytes % 8 or rows.data_ptr() % 8:
        return None
    return rows.view(len(rows), -1).view(torch.int64)


def _from_words(words, like):
    """A selection of _as_words(like) as `like`'s dtype and sample shape."""
    return words.view(like.dtype).view((len(words),) + tuple(like.shape[1:]))


def _loss_refusal(device):
    if device.type != "cuda":
        return "not a CUDA device (%s)" % device
    if not hasattr(torch, "compile"):
        return "PyTorch %s has no torch.compile" % torch.__version__
    return None


class InvalidLayer(ValueError):
    """A quantized layer the engine cannot take; the message names the layer and field."""


def quantized_layers(host, block):
    """(name, module) of the block's layers AutoRound's wrapper_block wraps."""
    return [(n, m) for n, m in block.named_modules()
            if type(m) in tuple(host.SUPPORTED_LAYER_TYPES) and getattr(m, "bits", 16) <= 8]


def unsupported(q, host, block, active_inputs, device):
    """Why this block's tuning is not for this loop (AutoRound's own loop runs it), or None."""
    checks = [
        (q.iters < 1, "iters=%d (no tuning)" % q.iters),
        (q.optimizer is not host.SignSGD or bool(q.momentum), "an optimizer other than pure SignSGD (momentum %s)"
         % (q.momentum,)),
        (q.dynamic_max_gap > 0 and not q.not_use_best_mse, "dynamic_max_gap (an early stop the host decides)"),
        (bool(q.enable_norm_bias_tuning), "enable_norm_bias_tuning"),
        (resolved_device(getattr(q, "_loss_device", device)) != resolved_device(device),
         "a loss device other than the tuning device"),
        (len({tuple(x.shape) for x in active_inputs}) != 1, "calibration inputs of different shapes"),
        (any(x.shape[getattr(q.block_forward, "batch_dim", 0)] != 1 for x in active_inputs[:1]),
         "calibration inputs of more than one sample each"),
    ]
    for name, m in quantized_layers(host, block):
        checks += [
            (type(m) is not torch.nn.Linear, "layer %r: %s (the engine takes torch.nn.Linear)" % (
                name, type(m).__name__)),
            (getattr(m, "act_bits", 16) <= 8, "layer %r: activation quantization (act_bits %s)" % (
                name, getattr(m, "act_bits", None))),
            (str(getattr(m, "data_type", "int")) != "int", "layer %r: data_type %r" % (
                name, getattr(m, "data_type", None))),
            # AutoRound sets these on every layer, None where unused (W4A16 int: all None).
            (any(getattr(m, a, None) is not None for a in ("super_bits", "awq_clip_max", "weight_global_scale")),
             "layer %r: super groups, AWQ clipping or a global scale" % name),
            (bool(m._forward_hooks or m._forward_pre_hooks), "layer %r: forward hooks" % name),
        ]
    return next((reason for failed, reason in checks if failed), None)


def _scale_dtype(name, m):
    value = getattr(m, "scale_dtype", torch.float16)
    dtype = _SCALE_DTYPES.get(value, value) if isinstance(value, str) else value
    if dtype not in _WEIGHT_DTYPES:
        raise InvalidLayer("layer %r: scale_dtype %r is not float16, bfloat16 or float32" % (name, value))
    return dtype


def check(host, block, device):
    """Each quantized layer's engine options, or InvalidLayer naming the layer and field;
    nothing allocated or written before."""
    device, layers = resolved_device(device), []
    for name, m in quantized_layers(host, block):
        w = m.weight
        if w.dim() != 2:
            raise InvalidLayer("layer %r: weight has shape %s, expected (rows, columns)" % (name, tuple(w.shape)))
        if w.dtype not in _WEIGHT_DTYPES:
            raise InvalidLayer("layer %r: weight has dtype %s, expected float16, bfloat16 or float32" % (
                name, w.dtype))
        if w.device != device:
            raise InvalidLayer("layer %r: weight is on %s, not the tuning device %s" % (name, w.device, device))
        if m.bits not in BITS:
            raise InvalidLayer("layer %r: bits = %r is not one of 2, 3, 4, 8" % (name, m.bits))
        group_size = m.group_size
        if not isinstance(group_size, int) or not (group_size == -1 or
                                                   (group_size > 0 and w.shape[1] % group_size == 0)):
            raise InvalidLayer("layer %r: group_size %r does not divide the weight's %d columns" % (
                name, group_size, w.shape[1]))
        scale_dtype = _scale_dtype(name, m)
        options = (m.bits, group_size, bool(getattr(m, "sym", True)), scale_dtype,
                   1e-8 if scale_dtype == torch.float32 else 1e-5)  # WrapperLinear's q_scale_thresh
        layers.append((name, m, options))
    return layers


def expert_groups(layers):
    """The block's experts as the engine takes them together: ([names of one projection's
    experts, by expert index], ...), and None; or ([], why not) where one projection's
    experts differ in weight shape, dtype or options (then every expert goes layer by
    layer); ([], None) for a block without experts."""
    by_projection = collections.OrderedDict()
    for name, m, options in layers:
        match = _EXPERT.match(name)
        if match:
            moe, index, projection = match.groups()
            by_projection.setdefault((moe, projection), []).append((int(index), name, m, options))
    groups = []
    for (moe, projection), members in by_projection.items():
        members.sort(key=lambda member: member[0])
        first_index, _, first, first_options = members[0]
        for index, name, m, options in members[1:]:
            unlike = [what for what, differs in (
                ("weight shape %s" % (tuple(m.weight.shape),), m.weight.shape != first.weight.shape),
                ("weight dtype %s" % (m.weight.dtype,), m.weight.dtype != first.weight.dtype),
                ("options %s" % (options,), options != first_options)) if differs]
            if unlike:
                return [], "experts %s: expert %d has %s, unlike expert %d's" % (
                    (moe + "." if moe else "") + "experts.*." + projection, index, ", ".join(unlike), first_index)
        groups.append([name for _, name, _, _ in members])
    return groups, None


class NativeTuning:
    """One block's tuning state and loop; run() returns AutoRound's best_params."""

    def __init__(self, q, host, ctx, block, layers, active_inputs, fp_outputs, input_others, valid_token_mask, device,
                 qlink_device):
        self.q, self.host, self.ctx, self.block = q, host, ctx, block
        self.device, self.qlink_device = resolved_device(device), qlink_device
        self.runner = q.block_forward
        dim = getattr(self.runner, "batch_dim", 0)
        self.others = _on_device(self.runner, input_others, self.device, dim)
        self.inputs = torch.cat([x.to(self.device) for x in active_inputs], dim=dim)
        self.targets = torch.cat([y.to(self.device) for y in fp_outputs], dim=dim)
        self.input_words, self.target_words = _as_words(self.inputs, dim), _as_words(self.targets, dim)
        self.layers = layers
        self.expert_groups, self.experts_refusal = expert_groups(layers)
        self.has_experts = bool(self.expert_groups) or self.experts_refusal is not None
        self.state = {}  # layer name -> [v, min_scale, max_scale]
        for name, m, (_, group_size, _, _, _) in layers:
            rows, cols = m.weight.shape
            group_len = cols if group_size == -1 else group_size
            groups = rows * cols // group_len
            self.state[name] = [torch.zeros(groups, group_len, device=self.device, requires_grad=True),
                                torch.ones(groups, device=self.device, requires_grad=True),
                                torch.ones(groups, device=self.device, requires_grad=True)]
        self.params, self.lr_groups, lrs = self._groups()
        self.lrs = torch.stack([torch.tensor(lr) for lr in lrs]).to(self.device)
        self.best = [torch.zeros_like(p) for p in self.params]
        self.best_loss = torch.full((1,), torch.finfo(torch.float).max, device=self.device)
        self.key = torch.zeros(1, device=self.device)  # the iteration's loss as the best parameters' key
        self.epoch = torch.zeros(1, dtype=torch.int64, device=self.device)
        # Each iteration's loss as AutoRound sums it (a float64 of fp32 losses over num_elm).
        self.losses = torch.zeros(max(q.iters, 1), dtype=torch.float64, device=self.device)
        gas = q.gradient_accumulate_steps
        self.mse = torch.nn.MSELoss(reduction="mean" if gas == 1 else "sum").to(self.device)
        self.batch_size = q.calibration_context.batch_size
        global_batch = global_batch_size(q, len(active_inputs))
        self.v_step_refusal = None if global_batch <= self.batch_size else (
            "%d sub-batches an iteration (gradient_accumulate_steps %d): v's gradients add up before the step" % (
                -(-global_batch // self.batch_size), gas))
        rounding = {id(state[0]) for state in self.state.values()}
        # The tensors the step after the backward takes: the range factors where v steps inside it.
        self.stepped = [i for i, p in enumerate(self.params) if self.v_step_refusal or id(p) not in rounding]
        self.index_of = {id(p): i for i, p in enumerate(self.params)}
        self.num_elm = sum(active_inputs[i].numel() for i in range(global_batch)) if gas != 1 else 1
        self.num_elm = 1 if self.num_elm <= 0 else self.num_elm
        # AutoRound's valid-token mask: its rows on the device, selected by device indices in
        # its own _get_loss; each sample's count of valid tokens (its _get_non_zero_cnt), summed
        # over an iteration's batch on the device for that iteration's num_elm.
        self.mask, self.mask_counts = None, None
        if valid_token_mask:
            self.mask = _DeviceRows(torch.cat([m.to(self.device) for m in valid_token_mask], dim=0))
            self.mask_counts = torch.tensor([q._get_non_zero_cnt(valid_token_mask, [i])
                                             for i in range(len(valid_token_mask))], dtype=torch.int64).to(self.device)
        sampler = host.IndexSampler(len(active_inputs), global_batch)
        draws = [[int(i) for i in sampler.next_batch()] for _ in range(q.iters)]  # AutoRound's draws, in order
        self.draws = torch.tensor(draws or [[0] * global_batch], dtype=torch.long).to(self.device)
        self.index = self.draws[0].clone()
        self.forward_module = _Forward(self.runner, block)
        self.loss_refusal = _loss_refusal(self.device)

    def _groups(self):
        """The tuned tensors in AutoRound's order and each one's learning-rate group:
        rounding offsets grouped by their layer's lr, then (with min-max tuning) the range
        factors by their layer's minmax lr (SignRoundQuantizer.quantize_block's groups)."""
        q = self.q
        round_groups, minmax_groups = collections.OrderedDict(), collections.OrderedDict()
        for name, m, _ in self.layers:
            lr, minmax_lr = learning_rates(q, m.bits, log=True)
            v, lo, hi = self.state[name]
            round_groups.setdefault(float(lr), []).append(v)
            if q.enable_minmax_tuning:
                minmax_groups.setdefault(float(minmax_lr), []).extend([lo, hi])
        params, groups, lrs = [], [], []
        for k, (lr, ps) in enumerate(list(round_groups.items()) + list(minmax_groups.items())):
            lrs.append(lr)
            params += ps
            groups += [k] * len(ps)
        return params, groups, lrs

    def _quant_dequant(self):
        """{"<layer>.weight": its quant-dequantized weight}: each projection's experts in
        one engine call, the other layers in one call per options set."""
        grouped = {name for names in self.expert_groups for name in names}
        by_options = collections.OrderedDict()
        for name, m, options in self.layers:
            if name not in grouped:
                by_options.setdefault(options, []).append((name, m))
        options_of = {name: options for name, _, options in self.layers}
        modules = {name: m for name, m, _ in self.layers}
        calls = [(signround_qdq_layers, options, members) for options, members in by_options.items()]
        calls += [(signround_qdq_experts, options_of[names[0]], [(name, modules[name]) for name in names])
                  for names in self.expert_groups]
        weights = {}
        self.ran = []  # per engine call: whether its backward ran (a gradient reached one of its weights)
        self.call_layers = [[name for name, _ in members] for _, _, members in calls]
        for qdq_call, (bits, group_size, sym, scale_dtype, thresh), members in calls:
            step = None
            if self.v_step_refusal is None:
                at = [self.index_of[id(self.state[name][0])] for name, _ in members]
                step = VStep(self.lrs, [self.lr_groups[i] for i in at], self.key, self.best_loss,
                             [self.best[i] for i in at])
            qdq = qdq_call([(name, m.weight, *self.state[name]) for name, m in members], bits=bits,
                           group_size=group_size, sym=sym, scale_dtype=scale_dtype, q_scale_thresh=thresh,
                           ctx=self.ctx, device=self.qlink_device, step=step)
            weights.update({"block." + name + ".weight": w for (name, _), w in zip(members, qdq)})
            self.ran.append(False)
            for w in qdq:
                w.register_hook(functools.partial(self._mark_ran, len(self.ran) - 1))
        return weights

    def _mark_ran(self, call, grad):
        self.ran[call] = True

    def _unreached(self):
        """The tensors to step beyond self.stepped where an engine call's backward did not
        run (its layers, experts the router gave no tokens, were not called this iteration):
        AutoRound's wrappers of them did not run, so their parameters have no gradient and
        SignSGD does not step them, but they are kept as best with the rest. Zero gradients
        step by nothing; v, stepped in the backward that did not run, joins the step."""
        extra = []
        for call, names in enumerate(self.call_layers):
            if self.ran[call]:
                continue
            for name in names:
                for t in self.state[name]:
                    if id(t) in self.index_of and t.grad is None:
                        t.grad = torch.zeros_like(t)
                v = self.index_of.get(id(self.state[name][0]))
                if v is not None and v not in self.stepped:
                    extra.append(v)
        return extra

    def iteration(self):
        """One iteration, on the device only: the batch at self.index in AutoRound's
        sub-batches, loss and backward, the step (best kept, schedule advanced), the loss
        recorded at the step counter."""
        q, dim = self.q, getattr(self.runner, "batch_dim", 0)
        for p in self.params:
            p.grad = None
        weights = self._quant_dequant()
        num_elm = self.num_elm
        if self.mask_counts is not None:  # AutoRound: its batch's valid tokens, 1 where there are none
            num_elm = self.mask_counts.index_select(0, self.index).sum().clamp(min=1).double()
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        for start in range(0, self.index.numel(), self.batch_size):
            idx = self.index[start:start + self.batch_size]
            if self.input_words is None:
                x, others = self.runner.select_batch(self.inputs, self.others, idx)  # AutoRound's own selection
            else:
                words, others = self.runner.select_batch(self.input_words, self.others, idx)
                x = _from_words(words, self.inputs)
            pred = functional_call(self.forward_module, weights, (x, others))
            if self.target_words is None:
                ref = torch.index_select(self.targets, dim, idx)
            else:
                ref = _from_words(torch.index_select(self.target_words, 0, idx), self.targets)
            if self.loss_refusal is None:
                mask = self.mask.rows.index_select(0, idx).unsqueeze(-1) if self.mask else None
                loss = _compiled_mse()(pred, ref, mask, self.mse.reduction)
            else:
                rows = [idx[k:k + 1] for k in range(idx.numel())]  # the samples, as device indices
                loss = q._get_loss(pred, ref, rows, self.mse, self.device, self.mask)
            total = total + loss.detach().double().reshape(1) / num_elm
            # The engine keeps the parameters of the lowest fp32 key (v's step in the backward
            # reads it). not_use_best_mse: AutoRound keeps the last iteration's, which a key
            # falling every step makes the engine keep.
            self.key.copy_(-self.epoch.float() if q.not_use_best_mse else total.float())
            q._scale_loss_and_backward(None, loss)
        self.losses.index_copy_(0, self.epoch, total)
        at = sorted(self.stepped + self._unreached())
        params, groups, best = ([xs[i] for i in at] for xs in (self.params, self.lr_groups, self.best))
        schedule = dict(epoch=self.epoch, total_iters=q.iters, loss=self.key, best_loss=self.best_loss, ctx=self.ctx,
                        device=self.qlink_device)
        if self.expert_groups:  # every tensor in one launch on a GPU (one per tensor: two per expert and linear)
            signsgd_experts_step([params], self.lrs, lr_groups=[groups], best=[best], **schedule)
        else:
            signsgd_step(params, self.lrs, lr_groups=groups, best=best, **schedule)
        for p in self.params:
            p.grad = None

    def _compile_loss(self):
        """The compiled loss run once, forward and backward, for each sub-batch size of the
        iterations: compiling synchronizes the host, here rather than inside the loop."""
        dim, total = getattr(self.runner, "batch_dim", 0), self.draws.shape[1]
        for rows in sorted({min(self.batch_size, total - start) for start in range(0, total, self.batch_size)}):
            ref = self.targets.narrow(dim, 0, rows)
            pred = ref.detach().clone().requires_grad_()
            mask = self.mask.rows[:rows].unsqueeze(-1) if self.mask else None
            _compiled_mse()(pred, ref, mask, self.mse.reduction).backward()

    def run(self, graphs):
        """AutoRound's iterations; graphs(reason=None): counts whether the step replayed
        as a CUDA graph. Returns (best_params, losses, best_iter, last_loss)."""
        q = self.q
        if self.loss_refusal is None:
            self._compile_loss()
        graph, reason = None, None
        if self.device.type != "cuda":
            reason = "not a CUDA device (%s)" % self.device
        elif q.iters <= WARMUP:
            reason = "iters %d <= %d warm-up iterations" % (q.iters, WARMUP)
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(stream) if stream is not None else _Nothing():
                for i in range(q.iters):
                    self.index.copy_(self.draws[i])
                    if graph is not None:
                        graph.replay()
                        continue
                    if i + 1 == WARMUP and reason is None:
                        with _host_reads() as reads:
                            self.iteration()
                        if reads:
                            reason = "the iteration reads the device from the host (%s)" % reads[0]
                        else:
                            graph, reason = self._capture(stream)
                        continue
                    self.iteration()
        finally:
            # However the loop ends: the caller's stream goes on (and reuses what this tuning
            # frees, AutoRound's own loop after a failure) only behind the iterations queued here.
            if stream is not None:
                torch.cuda.current_stream(self.device).wait_stream(stream)
        graphs(reason)
        losses = self.losses[:q.iters].tolist()  # the one read of the loop's results
        if q.not_use_best_mse:
            return self._best_params(), losses, q.iters, losses[-1] if losses else 0
        # AutoRound's choice, the first strictly lowest, on the keys the engine compared
        keys = torch.tensor(losses, dtype=torch.float64).float().tolist()
        best_key, best_iter = torch.finfo(torch.float).max, 0
        for i, key in enumerate(keys):
            if key < best_key:
                best_key, best_iter = key, i
        improved = best_key < torch.finfo(torch.float).max
        return self._best_params() if improved else {}, losses, best_iter, losses[best_iter]

    def _capture(self, stream):
        """The iteration as a CUDA graph, or (None, why not); capturing runs nothing, so a
        failed capture leaves the state as the eager iterations left it."""
        graph = torch.cuda.CUDAGraph()
        try:
            # torch.cuda.graph's capture without what its __enter__ does first: a device
            # synchronize and the allocator's caches emptied (the device's and the page-locked
            # CPU memory's). Those leave the GPU idle from the moment the warm-up iterations
            # still queued on `stream` finish until the host has captured and instantiated the
            # graph; without them the queued iterations run while the host captures (capturing
            # records work and runs none), and the first replay follows them on `stream`. The
            # capture is otherwise the same: capture_begin's defaults (a memory pool of the
            # graph's own, the "global" capture mode), capture_end on the way out however the
            # iteration went. The blocks the warm-up freed stay in the allocator's cache instead
            # of going back to the driver first, so the graph's pool takes memory beside them.
            with torch.cuda.stream(stream):
                graph.capture_begin()
                try:
                    self.iteration()
                finally:
                    graph.capture_end()
        except Exception as error:  # noqa: BLE001 (counted; the eager iterations go on)
            for p in self.params:
                p.grad = None
            return None, "capture failed: %s: %s" % (type(error).__name__, error)
        return graph, None

    def best_on_device(self):
        """{layer: {"value", "min_scale", "max_scale"}} of the best parameters the engine kept,
        its own tensors on the tuning device (no copy)."""
        kept = dict(zip(map(id, self.params), self.best))
        return {name: {key: kept[id(t)] for key, t in zip(("value", "min_scale", "max_scale"), self.state[name])
                       if id(t) in kept} for name, _, _ in self.layers}

    def _best_params(self):
        """collect_best_params' layout: best_on_device() copied to AutoRound's cache device."""
        cache = self.q.compress_context.cache_device
        return {name: {key: t.to(cache, copy=True) for key, t in tuned.items()}
                for name, tuned in self.best_on_device().items()}


@contextlib.contextmanager
def _host_reads():
    """Runs its body under PyTorch's sync debug mode ("warn"), the mode before restored;
    the list it gives holds, after the body, the first line of each warning of a call that
    waited on the device (an implicit synchronization: .item(), nonzero, a copy to the host).
    The warning PyTorch gives once a process on turning the mode on ("Synchronization debug
    mode is a prototype feature ...") is not a read: it refused the first block's graph."""
    reads = []
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield reads
        finally:
            torch.cuda.set_sync_debug_mode(before)
    reads += [str(w.message).splitlines()[0].split(" (Triggered internally")[0] for w in caught
              if "synchroniz" in str(w.message) and "prototype feature" not in str(w.message)]


def _on_device(runner, others, device, dim):
    """AutoRound's input_others on the tuning device, each per-sample list of tensors (one
    row each) stacked into one tensor: the runner's select_batch then takes a batch by an
    index_select, as it does the stacked inputs, where a list would be indexed element by
    element from the host (a synchronization per sample, and no CUDA graph)."""
    def move(value):
        if isinstance(value, torch.Tensor):
            return value.to(device)
        if isinstance(value, (list, tuple)):
            return type(value)(move(v) for v in value)
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        return value
    shared = getattr(runner, "shared_cache_keys", ())
    out = {}
    for key, value in others.items():
        rows = isinstance(value, list) and value and key not in shared and all(
            isinstance(t, torch.Tensor) and t.dim() > dim and t.shape[dim] == 1 for t in value)
        out[key] = torch.cat([t.to(device) for t in value], dim=dim) if rows else move(value)
    return out


class _DeviceRows:
    """A stacked tensor as AutoRound's per-sample list: truthy, indexed by a one-element
    device index tensor (a gather on the device, no host read)."""

    def __init__(self, rows):
        self.rows = rows

    def __bool__(self):
        return True

    def __getitem__(self, index):
        return self.rows[index]


class _Forward(torch.nn.Module):
    """The block through AutoRound's runner, as one module functional_call can swap the
    block's weights in."""

    def __init__(self, runner, block):
        super().__init__()
        self.runner, self.block = runner, block

    def forward(self, x, others):
        return self.runner._normalize_output(self.runner._forward_one_batch(self.block, x, others), self.block)


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
