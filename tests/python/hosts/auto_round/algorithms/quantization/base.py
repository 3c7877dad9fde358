"""Stand-in for auto_round.algorithms.quantization.base.BaseQuantizer: the per-layer RTN
quantization every block quantizer falls back on."""
import torch

from auto_round.utils import set_module
from auto_round.utils.device_manager import device_manager
from auto_round.wrapper import WrapperLinear


class BaseQuantizer:
    def __init__(self, config):
        self.config = config
        self.model = None
        self.block_forward = None

    def quantize_layer_outside_block(self, layer, fp_inputs=None, q_inputs=None, disable_opt_rtn=None, input_ids=None):
        self._quantize_layer_via_rtn(layer, disable_opt_rtn=disable_opt_rtn)

    @torch.no_grad()
    def _quantize_layer_via_rtn(self, layer, disable_opt_rtn=None):
        tuning_device = layer.tuning_device if hasattr(layer, "tuning_device") else device_manager.device
        layer = layer.to(tuning_device)
        wrapped = WrapperLinear(layer, enable_minmax_tuning=False, device=tuning_device, enable_round_tuning=False,
                                disable_opt_rtn=disable_opt_rtn)
        set_module(self.model, layer.global_name, wrapped.unwrapper({}))
