"""Stand-in for AutoRound's SignRoundQuantizer: the serial block-tuning loop (wrappers,
per-layer learning rates, SignSGD, a linear lr decay, a shuffled sampler, the best iterate
by strictly lower loss)."""
import dataclasses
import types

import torch

from auto_round.algorithms.quantization.base import BaseQuantizer
from auto_round.algorithms.quantization.sign_round.sign_sgd import SignSGD
from auto_round.compressors.utils import IndexSampler, collect_best_params
from auto_round.logger import logger
from auto_round.utils.device_manager import device_manager
from auto_round.wrapper import unwrapper_block, wrapper_block


@dataclasses.dataclass
class SignRoundConfig:
    iters: int = 200
    lr: float = None
    minmax_lr: float = None
    lr_scheduler: object = None
    momentum: float = None
    enable_minmax_tuning: bool = True
    enable_norm_bias_tuning: bool = False
    gradient_accumulate_steps: int = 1
    enable_alg_ext: bool = False
    not_use_best_mse: bool = False
    enable_quanted_input: bool = True
    dynamic_max_gap: int = -1
    enable_lfq: bool = False
    is_act_nv_fp: bool = False

    def compute_lr(self, bits):
        """A layer's lr for its bit width (AutoRound's heuristic when lr is not given)."""
        if self.lr is not None:
            return self.lr
        if self.iters <= 0:
            return None
        return 2.0 / self.iters if self.iters >= 1000 and bits is not None and bits <= 3 else 1.0 / self.iters

    def compute_minmax_lr(self, bits):
        return self.minmax_lr if self.minmax_lr is not None else self.compute_lr(bits)


class SignRoundQuantizer(BaseQuantizer):
    def __init__(self, config):
        super().__init__(config)
        # The config's fields as attributes, each by name as the host sets them.
        self.iters, self.lr_scheduler, self.momentum = config.iters, config.lr_scheduler, config.momentum
        self.enable_minmax_tuning = config.enable_minmax_tuning
        self.enable_norm_bias_tuning = config.enable_norm_bias_tuning
        self.gradient_accumulate_steps, self.enable_alg_ext = config.gradient_accumulate_steps, config.enable_alg_ext
        self.not_use_best_mse, self.enable_quanted_input = config.not_use_best_mse, config.enable_quanted_input
        self.dynamic_max_gap, self.enable_lfq = config.dynamic_max_gap, config.enable_lfq
        self.is_act_nv_fp = config.is_act_nv_fp
        self.lr = config.lr if config.lr is not None else 1.0 / max(config.iters, 1)
        self.minmax_lr = config.minmax_lr if config.minmax_lr is not None else self.lr
        self.optimizer = SignSGD
        self.wrapper_block = wrapper_block
        self._config = config
        self.compress_context = types.SimpleNamespace(cache_device="cpu", low_gpu_mem_usage=False,
                                                      enable_torch_compile=False, clear_memory=lambda *a: None)
        self.calibration_context = types.SimpleNamespace(batch_size=8)
        self.model_context = types.SimpleNamespace(amp=False, amp_dtype=torch.float32, is_diffusion=False)
        self.scheme = types.SimpleNamespace(data_type="int")

    def _maybe_log_low_bit_lr(self, bits):
        pass

    def dispatch_block(self, block, input_ids, input_others):
        """The block on the tuning device before its tuning (AutoRound's own spreads it over
        several GPUs by an accelerate device map where there are several)."""
        if len(device_manager.device_list) > 1:
            raise NotImplementedError("the stand-in does not spread a block over devices")
        block = block.to(device_manager.device)
        self._card_0_in_high_risk, self._loss_device = False, device_manager.device
        return block

    def _get_non_zero_cnt(self, tensor, indices):
        return sum(int(torch.count_nonzero(tensor[i])) for i in indices)

    def _compute_valid_token_mask(self, input_ids):
        masks = [(ids != -100).long() for ids in input_ids]
        return None if all(bool(m.all()) for m in masks) else masks

    def _get_loss(self, pred_output, ref_output, indices, loss_func, device="cpu", valid_token_mask=None,
                  input_ids=None):
        if valid_token_mask:
            mask = torch.cat([valid_token_mask[i] for i in indices], dim=0).to(device).unsqueeze(-1)
            return loss_func((pred_output * mask).float(), (ref_output * mask).float())
        return loss_func(pred_output.float(), ref_output.float())

    def _scale_loss_and_backward(self, scaler, loss):
        scale_loss = loss * 1000
        scale_loss.backward()
        return scale_loss

    def _step(self, scaler, optimizer, lr_schedule):
        optimizer.step()
        optimizer.zero_grad()
        lr_schedule.step()

    def quantize_block(self, block, fp_inputs, input_others, fp_outputs, q_inputs, block_ctx, input_ids=None,
                       **kwargs):
        device = device_manager.device
        valid_token_mask = None
        if input_ids is not None:
            if not hasattr(self, "_cached_valid_token_mask"):
                self._cached_valid_token_mask = self._compute_valid_token_mask(input_ids)
            valid_token_mask = self._cached_valid_token_mask
        active_inputs = q_inputs if (q_inputs is not None and self.enable_quanted_input) else fp_inputs
        nsamples = len(active_inputs)
        quantized, unquantized = self.wrapper_block(block, self.enable_minmax_tuning, self.enable_norm_bias_tuning,
                                                    enable_torch_compile=False, device=device)
        round_groups, minmax_groups = {}, {}  # by each layer's lr for its bit width
        for _n, m in block.named_modules():
            if hasattr(m, "orig_layer"):
                bits = getattr(m.orig_layer, "bits", None)
                lr = self._config.compute_lr(bits)
                lr = self.lr if lr is None else lr
                minmax_lr = self._config.compute_minmax_lr(bits)
                minmax_lr = self.minmax_lr if minmax_lr is None else minmax_lr
                for key, p in m.params.items():
                    groups = minmax_groups if ("min" in key or "max" in key) else round_groups
                    groups.setdefault(float(minmax_lr if groups is minmax_groups else lr), []).append(p)
        if not round_groups and not minmax_groups:
            unwrapper_block(block, {})
            return {}
        params = [{"params": ps, "lr": torch.tensor(lr)} for lr, ps in round_groups.items()]
        if self.enable_minmax_tuning:
            params += [{"params": ps, "lr": torch.tensor(lr)} for lr, ps in minmax_groups.items()]
        extra = {} if self.momentum is None else {"momentum": self.momentum}
        optimizer = self.optimizer(params, lr=torch.tensor(self.lr), weight_decay=0, **extra)
        lr_schedule = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.0,
                                                        total_iters=self.iters)
        mse_loss = torch.nn.MSELoss(reduction="mean" if self.gradient_accumulate_steps == 1 else "sum")
        batch_size = self.calibration_context.batch_size
        global_batch_size = min(nsamples, batch_size * self.gradient_accumulate_steps)
        num_elm = 1
        if self.gradient_accumulate_steps != 1 and not valid_token_mask:
            num_elm = sum(active_inputs[i].numel() for i in range(global_batch_size))
        sampler = IndexSampler(nsamples, global_batch_size)
        best_loss, best_params, last_best_iter, init_loss = torch.finfo(torch.float).max, {}, 0, None
        self.losses = []  # the stand-in's record of every iteration's loss, for the tests
        for i in range(self.iters):
            total_loss = 0
            global_indices = sampler.next_batch()
            if valid_token_mask:
                num_elm = self._get_non_zero_cnt(valid_token_mask, global_indices)
            for start in range(0, len(global_indices), batch_size):
                indices = global_indices[start:start + batch_size]
                ref = torch.cat([fp_outputs[j] for j in indices], dim=0).to(device)
                pred = self.block_forward.forward(block, active_inputs, input_others, indices, device)
                loss = self._get_loss(pred, ref, indices, mse_loss, device, valid_token_mask)
                total_loss += loss.item() / num_elm
                self._scale_loss_and_backward(None, loss)
            self.losses.append(total_loss)
            if i == 0:
                init_loss = total_loss
            if total_loss < best_loss:
                best_loss = total_loss
                if not self.not_use_best_mse:
                    best_params, last_best_iter = collect_best_params(block, self.compress_context.cache_device), i
            if self.not_use_best_mse and i == self.iters - 1:
                best_params = collect_best_params(block, self.compress_context.cache_device)
            if not self.not_use_best_mse and 0 < self.dynamic_max_gap <= i - last_best_iter:
                break
            self._step(None, optimizer, lr_schedule)
        with torch.no_grad():
            unwrapper_block(block, best_params)
        logger.infoclean("quantized %d layers, loss iter 0: %.6f -> iter %d: %.6f", len(quantized), init_loss,
                         last_best_iter, best_loss)
        return best_params
