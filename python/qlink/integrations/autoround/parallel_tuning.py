"""AutoRound's block tuning (SignRoundQuantizer.quantize_block), data-parallel (seed 001):
a mirror of the block per replica, wrapped by AutoRound's own wrappers, a forward runner
per replica, each iteration's batch (AutoRound's own sampler) split contiguously over the
replicas, AutoRound's own loss, backward and optimizer step on every replica. The tuning
parameters' gradients are summed with qlink's all-reduce between backward and step:
sign-cast for pure SignSGD (every replica gets sign(sum), bit for bit), fp32 or bf16
otherwise; every replica then takes the same step from the same parameters, so the
replicas stay bit-identical and home's parameters are the run's.

The loss each replica backpropagates is its shard's share of the serial loss (a sum over
its samples divided by the whole batch's element count where AutoRound takes a mean), so
the summed gradient is the serial one up to rounding, and the reported loss is the sum
of the shares in rank order. Pure SignSGD steps on qlink's engine (NativeSteps: the
same step, LinearLR advanced on the device), anything else through AutoRound's optimizer."""
import copy

import torch

from ...collectives import PreparedAllReduce
from ...quant.placement import shard_sizes
from ...quant.signround import signsgd_step
from .contract import global_batch_size, learning_rates, valid_token_mask


class ReplicaFailed(RuntimeError):
    """A replica's part of an iteration raised; the message names the replica."""


class ReplicaDiverged(RuntimeError):
    """check_replicas: a replica's tuning parameters differ from home's after a step."""


def run_on_replicas(placement, fn, what):
    """fn(rank) on every replica at once (placement.run), an error re-raised naming its
    replica."""
    def named(rank):
        try:
            return fn(rank)
        except Exception as error:  # noqa: BLE001 (re-raised with the replica's name)
            device = placement.torch_devices[rank] if not placement.cpu else "qlink device %d" % placement.ids[rank]
            raise ReplicaFailed("replica %d (%s) failed during %s: %s: %s" % (
                rank, device, what, type(error).__name__, error)) from error
    return placement.run(named)


def param_groups(quantizer, block, log=False):
    """AutoRound's grouping of a wrapped block's tuning parameters: rounding offsets and
    min/max factors, each grouped by the learning rate of its layer's bit width. Returns
    the optimizer's param groups and how many tuning parameters there are."""
    round_groups, minmax_groups, count = {}, {}, 0
    for _n, m in block.named_modules():
        if hasattr(m, "orig_layer"):
            lr, minmax_lr = learning_rates(quantizer, getattr(m.orig_layer, "bits", None), log)
            for key, p in m.params.items():
                minmax = "min" in key or "max" in key
                (minmax_groups if minmax else round_groups).setdefault(float(minmax_lr if minmax else lr), []).append(p)
                count += 1
    groups = [{"params": ps, "lr": torch.tensor(lr)} for lr, ps in round_groups.items()]
    if quantizer.enable_minmax_tuning:
        groups += [{"params": ps, "lr": torch.tensor(lr)} for lr, ps in minmax_groups.items()]
    return groups, count


def move_tensor_attributes(ctx, block, device):
    """The plain tensor attributes AutoRound hangs on layers (act_max, imatrix, ...), which
    a mirror shares with its source, moved to the replica's device (its own attributes)."""
    for m in block.modules():
        tensors = {k: v for k, v in vars(m).items() if isinstance(v, torch.Tensor)}
        if tensors:
            vars(m).update(ctx.move_nested_to_device(tensors, device))


def make_mirrors(ctx, placement, block):
    """The block's mirrors for ranks 1.., their tensor attributes on their devices: new
    modules of qlink's, nothing of the block's changed."""
    if placement.cpu:  # one CPU memory: the CPU backend's virtual devices stand in for GPUs
        mirrors = [ctx.mirror_module(block, ["cpu"])[0] for _ in range(1, placement.world)]
    else:
        mirrors = ctx.mirror_module(block, placement.torch_devices[1:])
    for mirror, device in zip(mirrors, placement.torch_devices[1:]):
        move_tensor_attributes(ctx, mirror, device)
    return mirrors


class Replicas:
    """The block and its mirrors, wrapped, each with its optimizer, lr schedule, forward
    runner and calibration kwargs; rank 0 is home (the block itself)."""

    def __init__(self, quantizer, ctx, placement, block, mirrors, input_others):
        self.placement, self.ctx = placement, ctx
        self.blocks = [block] + mirrors
        self.devices = placement.torch_devices
        compile_ = quantizer.compress_context.enable_torch_compile
        names = [quantizer.wrapper_block(b, quantizer.enable_minmax_tuning, quantizer.enable_norm_bias_tuning,
                                         enable_torch_compile=compile_, device=d)
                 for b, d in zip(self.blocks, self.devices)]
        self.layer_names = names[0]  # (quantized, unquantized), the same on every replica
        grouped = [param_groups(quantizer, b, log=(r == 0)) for r, b in enumerate(self.blocks)]
        self.count = grouped[0][1]
        self.params = [[p for g in groups for p in g["params"]] for groups, _ in grouped]
        self.groups = [groups for groups, _ in grouped]
        self.input_others = [input_others] + [ctx.move_nested_to_device(input_others, d) for d in self.devices[1:]]
        self.runners = []
        for d in self.devices:
            runner = copy.copy(quantizer.block_forward)  # AutoRound's runner, forwarding on this replica's device
            runner.device = d
            self.runners.append(runner)

    def synchronize_start(self):
        """Home's tuning parameters into every replica: AutoRound initializes them the same
        way everywhere, this makes the identical start a fact."""
        if self.placement.world < 2:
            return
        sources = [p.data for p in self.params[0]]
        targets = [[p.data for p in ps] for ps in self.params[1:]]
        if self.placement.cpu:
            self.ctx.broadcast(sources, targets, source_device=self.placement.ids[0],
                               replica_devices=self.placement.ids[1:])
        else:
            self.ctx.broadcast(sources, targets)

    def check_identical(self, iteration):
        """Raises ReplicaDiverged unless every replica's tuning parameters equal home's."""
        home = [p.detach() for p in self.params[0]]
        for r in range(1, self.placement.world):
            theirs = [p.detach().to(home[0].device) for p in self.params[r]]
            if not all(torch.equal(a, b) for a, b in zip(home, theirs)):
                raise ReplicaDiverged("replica %d differs from home after step %d" % (r, iteration))


class GradientExchange:
    """Each replica's tuning-parameter gradients, flattened in a fixed order into one fp32
    buffer (a missing gradient as zeros), all-reduced by a prepared qlink plan and handed
    back as the gradients the optimizer steps on."""

    def __init__(self, ctx, placement, params, op, transport):
        self.params = params
        total = sum(p.numel() for p in params[0])
        self.buffers = [torch.zeros(total, dtype=torch.float32, device=d) for d in placement.torch_devices]
        self.plan = PreparedAllReduce(self.buffers, op=op, transport=transport, ctx=ctx, devices=placement.device_ids())

    def pack(self, rank):
        buf, offset = self.buffers[rank], 0
        for p in self.params[rank]:
            n = p.numel()
            if p.grad is None:
                buf[offset:offset + n].zero_()
            else:
                buf[offset:offset + n].copy_(p.grad.reshape(-1))
            offset += n

    def unpack(self, rank):
        buf, offset = self.buffers[rank], 0
        for p in self.params[rank]:
            n = p.numel()
            p.grad = buf[offset:offset + n].view_as(p).to(p.dtype)
            offset += n


class NativeSteps:
    """Each replica's pure SignSGD step on qlink's engine: its tuning parameters in the
    optimizer's order, each with its param group's learning rate, LinearLR's schedule
    advanced on the device (AutoRound's SignSGD and schedule, bit for bit)."""

    def __init__(self, ctx, placement, groups, iters):
        self.ctx, self.iters = ctx, iters
        self.ids = placement.ids if placement.cpu else [None] * placement.world  # qlink ids of the CPU's devices
        self.replicas = []
        for r, replica_groups in enumerate(groups):
            device = placement.torch_devices[r]
            params = [p for g in replica_groups for p in g["params"]]
            lr_groups = [k for k, g in enumerate(replica_groups) for _ in g["params"]]
            lrs = torch.stack([torch.as_tensor(g["lr"], dtype=torch.float32).reshape(()) for g in replica_groups])
            self.replicas.append((params, lr_groups, lrs.to(device), torch.zeros(1, dtype=torch.int64, device=device)))

    def step(self, rank):
        params, lr_groups, lrs, epoch = self.replicas[rank]
        signsgd_step(params, lrs, lr_groups=lr_groups, epoch=epoch, total_iters=self.iters, ctx=self.ctx,
                     device=self.ids[rank])
        for p in params:  # the optimizer's zero_grad
            p.grad = None


def tune_block(quantizer, host, ctx, placement, mirrors, exchange_op, transport, check_replicas, block, fp_inputs,
               input_others, fp_outputs, q_inputs, block_ctx, input_ids=None, **kwargs):
    """SignRoundQuantizer.quantize_block on placement.world replicas (the block and its
    mirrors); returns the best parameters as AutoRound's does. exchange_op: "sign" for
    pure SignSGD, else "sum"."""
    q = quantizer
    mask = valid_token_mask(q, input_ids)
    active_inputs = q_inputs if (q_inputs is not None and q.enable_quanted_input) else fp_inputs
    nsamples = len(active_inputs)

    reps = Replicas(q, ctx, placement, block, mirrors, input_others)
    quantized_names, unquantized_names = reps.layer_names
    if reps.count == 0:
        host.logger.info("quantized %d/%d layers in the block" % (len(quantized_names),
                                                                  len(quantized_names) + len(unquantized_names)))
        host.unwrapper_block(block, {})
        return {}
    reps.synchronize_start()
    if exchange_op == "sign":  # pure SignSGD: qlink's step
        native, step = NativeSteps(ctx, placement, reps.groups, q.iters), None
    else:
        extra = {} if q.momentum is None else {"momentum": q.momentum}
        optimizers = [q.optimizer(groups, lr=torch.tensor(q.lr), weight_decay=0, **extra) for groups in reps.groups]
        schedules = [torch.optim.lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=q.iters)
                     for o in optimizers]
        native, step = None, lambda r: q._step(None, optimizers[r], schedules[r])
    exchange = GradientExchange(ctx, placement, reps.params, exchange_op, transport) if placement.world > 1 else None

    mean = q.gradient_accumulate_steps == 1  # AutoRound's MSE: a mean per step, else a sum over the steps
    sum_loss = torch.nn.MSELoss(reduction="sum")
    batch_size = q.calibration_context.batch_size
    global_batch = global_batch_size(q, nsamples)
    num_elm = 1
    if not mean and not mask:
        num_elm = sum(active_inputs[i].numel() for i in range(global_batch))
    sampler = host.IndexSampler(nsamples, global_batch)
    best_loss, best_params, last_best_iter, init_loss = torch.finfo(torch.float).max, {}, 0, None

    def forward_backward(rank, shard, elements):
        """This replica's shard of the batch, in AutoRound's sub-batches; returns its sum of
        squared errors."""
        device, total = reps.devices[rank], 0.0
        for start in range(0, len(shard), batch_size):
            indices = shard[start:start + batch_size]
            ref = torch.cat([fp_outputs[i] for i in indices], dim=0).to(device)
            pred = reps.runners[rank].forward(reps.blocks[rank], active_inputs, reps.input_others[rank], indices,
                                              device)
            loss = q._get_loss(pred, ref, indices, sum_loss, device, mask)
            total += loss.item()
            q._scale_loss_and_backward(None, loss / elements if mean else loss)
        if exchange is not None:
            exchange.pack(rank)
        return total

    for i in range(q.iters):
        global_indices = sampler.next_batch()
        if mask:
            num_elm = q._get_non_zero_cnt(mask, global_indices)
        sizes = shard_sizes(len(global_indices), placement.world)
        shards = [global_indices[sum(sizes[:r]):sum(sizes[:r + 1])] for r in range(placement.world)]
        elements = sum(fp_outputs[j].numel() for j in global_indices)  # the serial mean's denominator
        sums = run_on_replicas(placement, lambda r: forward_backward(r, shards[r], elements), "iteration %d" % i)
        total_loss = (sum(sums) / elements if mean else sum(sums)) / num_elm
        if i == 0:
            init_loss = total_loss
        if total_loss < best_loss:
            best_loss = total_loss
            if not q.not_use_best_mse:
                best_params, last_best_iter = host.collect_best_params(block, q.compress_context.cache_device), i
        if q.not_use_best_mse and i == q.iters - 1:
            best_params = host.collect_best_params(block, q.compress_context.cache_device)
        if not q.not_use_best_mse and 0 < q.dynamic_max_gap <= i - last_best_iter:
            break
        if exchange is not None:
            exchange.plan.run()
            run_on_replicas(placement, exchange.unpack, "the gradient exchange of iteration %d" % i)
        run_on_replicas(placement, native.step if native is not None else step, "step %d" % i)
        if check_replicas:
            placement.synchronize()
            reps.check_identical(i)

    last_loss, best_iter = (total_loss, q.iters) if q.not_use_best_mse else (best_loss, last_best_iter)
    summary = " on %d replicas, loss iter 0: %.6f -> iter %d: %.6f" % (
        placement.world, init_loss, best_iter, last_loss)
    finish_block(host, q, block, best_params, quantized_names, unquantized_names, summary)
    return best_params


def finish_block(host, q, block, best_params, quantized_names, unquantized_names, summary):
    """What AutoRound does when a block's tuning ends: memory cleared, the best parameters
    written into the block as it unwraps it, one line logged (AutoRound's, `summary` after
    "in the block")."""
    q.compress_context.clear_memory()
    if unquantized_names:
        host.logger.info("Unquantized layers: %s" % unquantized_names)
    with torch.no_grad():
        host.unwrapper_block(block, best_params)
    getattr(host.logger, "infoclean", host.logger.info)("quantized %d/%d layers in the block%s" % (
        len(quantized_names), len(quantized_names) + len(unquantized_names), summary))
