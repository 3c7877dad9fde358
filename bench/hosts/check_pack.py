"""qlink's packer against GPTQModel's own on the GPU machine (issue 23): a 7B layer's
quantized weights (11008 x 4096 and 4096 x 11008, bf16, act-order groups) packed by
GPTQModel's pack_block on its Python path (its native extension is not built there, as in
the loop runs) and by qlink.quant.gptq_pack on the GPU; every buffer compared bit for bit,
both timed.
    python3 check_pack.py
"""
import time

from common import setup_paths

setup_paths()


def main():
    import torch
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from qlink.quant import gptq_pack
    torch.manual_seed(0)
    for bits in (2, 4, 8):
        for out_features, in_features in ((11008, 4096), (4096, 11008)):
            groups, maxq = in_features // 128, 2 ** bits - 1
            scales = torch.rand(out_features, groups) * 0.02 + 1e-3
            zeros = torch.randint(0, maxq + 1, (out_features, groups)).float()
            g_idx = (torch.arange(in_features) // 128)[torch.randperm(in_features)].to(torch.int32)
            codes = torch.randint(0, maxq + 1, (out_features, in_features)).float()
            linear = torch.nn.Linear(in_features, out_features, bias=False, dtype=torch.bfloat16)
            linear.weight.data = (scales[:, g_idx.long()] * (codes - zeros[:, g_idx.long()])).to(torch.bfloat16)
            module = TorchLinear(bits=bits, group_size=128, sym=True, desc_act=True, in_features=in_features,
                                 out_features=out_features, bias=False, pack_dtype=torch.int32, register_buffers=False)
            start = time.perf_counter()
            module.pack_block(linear, scales, zeros, g_idx)
            host_s = time.perf_counter() - start
            gptq_pack(linear.weight.detach(), scales.T.contiguous(), zeros.T.contiguous(), g_idx, bits,
                      device="cuda")  # warm
            start = time.perf_counter()
            qweight, qzeros = gptq_pack(linear.weight.detach(), scales.T.contiguous(), zeros.T.contiguous(), g_idx,
                                        bits, device="cuda")
            qlink_s = time.perf_counter() - start
            equal = torch.equal(qweight, module.qweight) and torch.equal(qzeros, module.qzeros)
            print("bits %d, %5d x %5d: equal %s, GPTQModel pack_block %.3f s, qlink gptq_pack %.3f s (%.0fx)" % (
                bits, out_features, in_features, equal, host_s, qlink_s, host_s / qlink_s), flush=True)


if __name__ == "__main__":
    main()
