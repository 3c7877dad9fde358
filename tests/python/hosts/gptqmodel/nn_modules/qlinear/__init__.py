"""Stand-in for gptqmodel.nn_modules.qlinear: a packable quantized linear whose pack_block
does what GPTQModel's does with a layer's quantized weight (the stand-in's own code): it
keeps g_idx, the scales as float16 and the bias, then packs the codes through the native
packer it imports at each call (pack_block_ext.pack_block_cpu, scales and zeros as
(groups, out)), and where that raises, in Python, 32 input columns at a time: each code
round((w + zero * scale) / scale) clamped to [0, maxq], 32 / bits to an int32 word along
the input (qweight) and along the output (qzeros)."""
import numpy as np
import torch
from torch import nn


class PackableQuantLinear(nn.Module):
    def __init__(self, bits, in_features, out_features, bias=False, name=None):
        super().__init__()
        self.name = name  # the module's path in the model, as GPTQModel's quantized linears keep it
        self.bits, self.in_features, self.out_features = bits, in_features, out_features
        self.pack_dtype, self.pack_dtype_bits, self.maxq = torch.int32, 32, 2 ** bits - 1
        self.register_buffer("bias", None)

    @torch.inference_mode()
    def pack_block(self, linear, scales, zeros, g_idx, block_in=8192, workers=1):
        weight = linear.weight.detach().to("cpu")
        self.register_buffer("g_idx", g_idx.to("cpu"))
        scales, zeros = scales.T.contiguous(), zeros.T.contiguous()
        self.register_buffer("scales", scales.to(dtype=torch.float16))
        if linear.bias is not None:
            self.register_buffer("bias", linear.bias.detach().to("cpu", dtype=torch.float16))
        if self.bits in (2, 4, 8):
            try:
                from .pack_block_ext import pack_block_cpu
                qweight, qzeros = pack_block_cpu(weight, scales, zeros, self.g_idx.to(torch.int32), self.bits,
                                                 self.pack_dtype_bits, block_in, workers)
                self.register_buffer("qweight", qweight.to(self.pack_dtype))
                self.register_buffer("qzeros", qzeros.to(self.pack_dtype))
                return
            except Exception:  # noqa: BLE001 (GPTQModel logs at debug level and packs in Python)
                pass
        self._pack_in_python(weight, scales, zeros, self.g_idx)

    def _pack_in_python(self, weight, scales, zeros, g_idx):
        groups, bits = scales.shape[0], self.bits
        per_word = 32 // bits
        group_of = g_idx.to(torch.int64)
        group_of = torch.where(group_of < 0, group_of + groups, group_of)
        scale_zeros = zeros * scales
        qweight = torch.empty(self.in_features // 32 * bits, self.out_features, dtype=torch.int32)
        shifts = (torch.arange(per_word, dtype=torch.int64) * bits).view(1, per_word, 1)
        for start in range(0, self.in_features, 32):
            cols = group_of[start:start + 32]
            codes = torch.round((weight[:, start:start + 32] + scale_zeros.index_select(0, cols).T)
                                / scales.index_select(0, cols).T)
            codes = codes.clamp_(0, self.maxq).to(torch.int32).T.contiguous().to(torch.int64)
            words = (codes.view(bits, per_word, -1) << shifts).sum(dim=1, dtype=torch.int64)
            qweight[start // 32 * bits:start // 32 * bits + bits] = (words & 0xFFFFFFFF).to(torch.int32)
        zeros_np = zeros.numpy().astype(np.uint32)
        qzeros = np.zeros((groups, self.out_features // per_word), dtype=np.uint32)
        for col in range(qzeros.shape[1]):
            for j in range(per_word):
                qzeros[:, col] |= zeros_np[:, col * per_word + j] << np.uint32(bits * j)
        self.register_buffer("qweight", qweight)
        self.register_buffer("qzeros", torch.from_numpy(qzeros.astype(np.int32)))
