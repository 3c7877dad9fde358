"""Data-parallel quantization engines on top of qlink's collectives: GPTQ (Hessians
summed in device order, rows quantized on every replica) and SignRound (tuning state
sharded by rows, weight gradients summed into their owners). The math is PyTorch's; qlink moves the data (HOSTS.md)."""
from .gptq import GPTQResult, gptq_quantize, hessian, parallel_gptq, parallel_hessian
from .placement import Placement, parallel_devices, shard_sizes
from .signround import SignRoundResult, sign_round

__all__ = ["GPTQResult", "gptq_quantize", "hessian", "parallel_gptq", "parallel_hessian", "Placement",
           "parallel_devices", "shard_sizes", "SignRoundResult", "sign_round"]
