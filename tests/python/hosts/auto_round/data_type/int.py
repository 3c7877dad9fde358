"""Stand-in for auto_round.data_type.int: AutoRound's int quant-dequant of a weight, group by
group (the tests' reference of its arithmetic, signround_reference.py), returning (the
quant-dequantized weight, each group's scale, its zero point; maxq symmetric)."""
import torch

from signround_reference import reference_qdq_parts


def quant_tensor_sym(tensor, bits=4, group_size=-1, v=0, min_scale=1.0, max_scale=1.0, scale_dtype=torch.float16,
                     q_scale_thresh=1e-5, **kwargs):
    return reference_qdq_parts(tensor, v, min_scale, max_scale, bits, group_size, True, scale_dtype, q_scale_thresh)


def quant_tensor_asym(tensor, bits=4, group_size=-1, v=0, min_scale=1.0, max_scale=1.0, scale_dtype=torch.float16,
                      q_scale_thresh=1e-5, **kwargs):
    return reference_qdq_parts(tensor, v, min_scale, max_scale, bits, group_size, False, scale_dtype, q_scale_thresh)


def quant_tensor_rtn_sym(tensor, bits=4, group_size=-1, q_scale_thresh=1e-5, scale_dtype=torch.float16, **kwargs):
    groups = tensor.numel() // (tensor.shape[-1] if group_size == -1 else group_size)
    ones = tensor.new_ones(groups, dtype=torch.float32)
    return quant_tensor_sym(tensor, bits, group_size, 0.0, ones, ones.clone(), scale_dtype, q_scale_thresh)
