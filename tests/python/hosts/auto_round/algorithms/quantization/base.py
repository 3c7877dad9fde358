"""Stand-in for auto_round.algorithms.quantization.base.BaseQuantizer: the block's dispatch
to the primary device and the per-layer RTN quantization every block quantizer falls back
on, optimized RTN turned off for an MoE model's routed experts as AutoRound turns it off."""
import types

import torch

from auto_round.logger import logger
from auto_round.utils import convert_module_to_hp_if_necessary, set_module
from auto_round.utils.device_manager import device_manager
from auto_round.wrapper import WrapperLinear


class BaseQuantizer:
    def __init__(self, config):
        self.config = config if config is not None else types.SimpleNamespace(
            disable_opt_rtn=False, orig_disable_opt_rtn=None, super_bits=None)
        self.model = None
        self.block_forward = None
        self.model_context = types.SimpleNamespace(amp_dtype=torch.float32, is_moe_model=False)
        self.compress_context = types.SimpleNamespace(enable_torch_compile=False)

    def dispatch_block(self, block, input_ids, input_others):
        return block.to(device_manager.device)

    def quantize_layer_outside_block(self, layer, fp_inputs=None, q_inputs=None, disable_opt_rtn=None, input_ids=None):
        self._quantize_layer_via_rtn(layer, disable_opt_rtn=disable_opt_rtn)

    @torch.no_grad()
    def _quantize_layer_via_rtn(self, layer, disable_opt_rtn=None):
        layer_name = layer.global_name
        layer = convert_module_to_hp_if_necessary(layer, self.model_context.amp_dtype, device_manager.device)
        set_module(self.model, layer_name, layer)
        tuning_device = layer.tuning_device if hasattr(layer, "tuning_device") else device_manager.device
        if disable_opt_rtn is None:
            disable_opt_rtn = bool(getattr(self.config, "disable_opt_rtn", False))
        if (not disable_opt_rtn and getattr(self.config, "orig_disable_opt_rtn", None) is None
                and self.model_context.is_moe_model and "expert" in layer.global_name
                and "shared_expert" not in layer.global_name and self.config.super_bits is None):
            disable_opt_rtn = True
            logger.warning_once("MoE layer detected: optimized RTN is disabled for efficiency.")
        layer = layer.to(tuning_device)
        wrapped = WrapperLinear(layer, device=tuning_device, enable_minmax_tuning=False, enable_norm_bias_tuning=False,
                                enable_round_tuning=False,
                                enable_torch_compile=self.compress_context.enable_torch_compile,
                                disable_opt_rtn=disable_opt_rtn, iters=0)
        set_module(self.model, layer_name, wrapped.unwrapper({}))
