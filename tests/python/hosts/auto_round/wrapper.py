"""Stand-in for auto_round.wrapper: WrapperLinear (rounding offsets `value` per group
element and range factors min/max per group, as AutoRound shapes them, tuned against the
quant-dequant of AutoRound's int data type: the tests' reference of its arithmetic,
signround_reference.py) and the block (un)wrappers; optimized RTN (disable_opt_rtn=False)
searches a range shrink per group."""
import torch

from auto_round.utils import set_module
from signround_reference import reference_qdq


def round_ste(x):
    return x + (torch.round(x) - x).detach()


class WrapperLinear(torch.nn.Module):
    def __init__(self, orig_layer, enable_minmax_tuning=True, enable_norm_bias_tuning=False, device="cpu",
                 enable_round_tuning=True, enable_torch_compile=False, disable_opt_rtn=True, **kwargs):
        super().__init__()
        self.orig_layer = orig_layer
        self.device = orig_layer.tuning_device if hasattr(orig_layer, "tuning_device") else device
        self.disable_opt_rtn = disable_opt_rtn
        self.q_scale_thresh = 1e-8 if getattr(orig_layer, "scale_dtype", None) == torch.float32 else 1e-5
        rows, cols = orig_layer.weight.shape
        group_len = cols if orig_layer.group_size == -1 else orig_layer.group_size
        groups = rows * cols // group_len
        self.params = {}
        self._init("value", (groups, group_len), 0.0, enable_round_tuning)
        self._init("min_scale", (groups,), 1.0, enable_minmax_tuning)
        self._init("max_scale", (groups,), 1.0, enable_minmax_tuning)

    def _init(self, name, shape, value, tunable):
        if tunable:
            p = torch.nn.Parameter(torch.full(shape, value, device=self.device), requires_grad=True)
            self.params[name] = p
        else:
            p = torch.tensor(value, device=self.device)
        setattr(self, name, p)

    def _qdq_weight(self, value, min_scale, max_scale):
        """(quant-dequantized weight, scale or None)."""
        layer = self.orig_layer
        if self.disable_opt_rtn:
            return reference_qdq(layer.weight.to(self.device), value, min_scale, max_scale, layer.bits,
                                 layer.group_size, getattr(layer, "sym", True),
                                 getattr(layer, "scale_dtype", torch.float16), self.q_scale_thresh), None
        min_scale.data.clamp_(0, 1)
        max_scale.data.clamp_(0, 1)
        w = layer.weight.to(self.device).float()
        rows, cols = w.shape
        g = w.reshape(rows, -1, layer.group_size)
        maxq = 2 ** layer.bits - 1
        lo, hi = torch.clamp(g.amin(-1), max=0), torch.clamp(g.amax(-1), min=0)
        shrinks = [1.0 - 0.05 * k for k in range(6)]
        weights = layer.imatrix.to(w.device).reshape(1, -1, layer.group_size) if hasattr(layer, "imatrix") else 1.0
        best, best_err = None, None
        for shrink in shrinks:  # optimized RTN: the range shrink with the least (imatrix-weighted) error per group
            scale = torch.clamp((hi * max_scale * shrink - lo * min_scale * shrink) / maxq, min=1e-9).unsqueeze(-1)
            zero = round_ste(-lo.unsqueeze(-1) * min_scale.unsqueeze(-1) * shrink / scale)
            offset = value if value.dim() == 0 else value.reshape_as(g)
            q = torch.clamp(round_ste(g / scale + offset) + zero, 0, maxq)
            dq = (q - zero) * scale
            err = ((dq - g) ** 2 * weights).sum(-1, keepdim=True)
            if best is None:
                best, best_err, best_scale = dq, err, scale
            else:
                take = err < best_err
                best, best_err = torch.where(take, dq, best), torch.minimum(err, best_err)
                best_scale = torch.where(take, scale, best_scale)
        return best.reshape(rows, cols).to(layer.weight.dtype), best_scale.squeeze(-1)

    def forward(self, x):
        w, _ = self._qdq_weight(self.value, self.min_scale, self.max_scale)
        return torch.nn.functional.linear(x, w, self.orig_layer.bias)

    def unwrapper(self, best_params):
        best_params = best_params or {}
        v = best_params.get("value", torch.tensor(0.0)).to(self.device)
        mn = best_params.get("min_scale", torch.tensor(1.0)).to(self.device)
        mx = best_params.get("max_scale", torch.tensor(1.0)).to(self.device)
        with torch.no_grad():
            w, scale = self._qdq_weight(v, mn.clone(), mx.clone())
            self.orig_layer.weight.data.copy_(w)
        if scale is not None:
            self.orig_layer.scale = scale.to("cpu")
        return self.orig_layer


def wrapper_block(block, enable_minmax_tuning, enable_norm_bias_tuning, enable_torch_compile=False, device="cpu",
                  **kwargs):
    quantized, unquantized = [], []
    for n, m in list(block.named_modules()):
        if type(m) is torch.nn.Linear:
            if getattr(m, "bits", 16) > 8:
                unquantized.append(n)
                continue
            set_module(block, n, WrapperLinear(m, enable_minmax_tuning, enable_norm_bias_tuning, device=device))
            quantized.append(n)
    return quantized, unquantized


@torch.no_grad()
def unwrapper_block(block, best_params):
    for n, m in list(block.named_modules()):
        if hasattr(m, "orig_layer"):
            set_module(block, n, m.unwrapper(best_params.get(n) if best_params else None))
