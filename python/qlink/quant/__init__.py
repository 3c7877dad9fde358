"""Quantization engines: GPTQ on qlink's native engine (Hessians merged in device order,
layers solved data-parallel behind the C ABI) and its packed int32 storage (gptq_pack);
SignRound's quant-dequant and SignSGD step on the native engine (signround_qdq,
signsgd_step; a block's experts in one call each: signround_qdq_experts,
signsgd_experts_step), and its data-parallel prototype in PyTorch on qlink's collectives (tuning
state sharded by rows, weight gradients summed into their owners)."""
from .gptq import GPTQLayer, GPTQResult, gptq_quantize, parallel_gptq, parallel_hessian
from .hessian import HessianAccumulator
from .pack import gptq_pack, gptq_pack_many
from .placement import Placement, parallel_devices, shard_sizes
from .signround import (SignRoundResult, sign_round, signround_qdq, signround_qdq_experts, signsgd_experts_step,
                        signsgd_step)

__all__ = ["GPTQLayer", "GPTQResult", "gptq_quantize", "parallel_gptq", "parallel_hessian", "Placement",
           "parallel_devices", "shard_sizes", "SignRoundResult", "sign_round", "signround_qdq", "signsgd_step",
           "signround_qdq_experts", "signsgd_experts_step", "HessianAccumulator", "gptq_pack", "gptq_pack_many"]
