"""Stand-in for AutoRound's iters=0 quantizers: RTN per layer, and optimized RTN (an
imatrix-weighted scale search) per layer."""
import torch

from auto_round.algorithms.quantization.base import BaseQuantizer
from auto_round.utils import check_to_quantized


class RTNQuantizer(BaseQuantizer):
    @torch.no_grad()
    def quantize_block(self, block, fp_inputs, input_others, fp_outputs, q_inputs, block_ctx, input_ids=None,
                       **kwargs):
        for _name, m in block.named_modules():
            if check_to_quantized(m):
                self._quantize_layer_via_rtn(m, disable_opt_rtn=True)
        return {}


class OptimizedRTNQuantizer(RTNQuantizer):
    @torch.no_grad()
    def quantize_block(self, block, fp_inputs, input_others, fp_outputs, q_inputs, block_ctx, input_ids=None,
                       **kwargs):
        for _name, m in block.named_modules():
            if hasattr(m, "imatrix"):
                m.imatrix /= m.imatrix_cnt
            if hasattr(m, "global_name") and check_to_quantized(m):
                self.quantize_layer_outside_block(m)
