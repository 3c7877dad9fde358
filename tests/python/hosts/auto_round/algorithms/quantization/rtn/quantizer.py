"""Stand-in for AutoRound's iters=0 quantizers: RTN per layer, and optimized RTN (an
imatrix-weighted scale search) per layer, its imatrix collected by forward hooks on the
block's quantized layers in the block's reference forward."""
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
    def register_fp_input_forward_hooks(self, block):
        return self._register_imatrix_hooks(block, with_count=True)

    def _register_imatrix_hooks(self, model, *, with_count=False):
        def collect_imatrix(module, input, output):
            input = input[0] if isinstance(input, (tuple, list)) else input
            squared = torch.sum(torch.pow(input.reshape(-1, input.shape[-1]).to(torch.float32), 2), dim=0)
            if not hasattr(module, "imatrix"):
                module.imatrix = squared
                if with_count:
                    module.imatrix_cnt = input.shape[0]
                return
            module.imatrix += squared.to(module.imatrix.device)
            if with_count:
                module.imatrix_cnt += input.shape[0]

        return [m.register_forward_hook(collect_imatrix) for _, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and check_to_quantized(m)]

    @torch.no_grad()
    def quantize_block(self, block, fp_inputs, input_others, fp_outputs, q_inputs, block_ctx, input_ids=None,
                       **kwargs):
        for _name, m in block.named_modules():
            if hasattr(m, "imatrix"):
                m.imatrix /= m.imatrix_cnt
            if hasattr(m, "global_name") and check_to_quantized(m):
                self.quantize_layer_outside_block(m)
