"""Stand-in for auto_round.wrapper: WrapperLinear (rounding offsets `value` per group
element and range factors min/max per group, as AutoRound shapes them, tuned against the
quant-dequant of AutoRound's int data type: the tests' reference of its arithmetic,
signround_reference.py) and the block (un)wrappers; optimized RTN (disable_opt_rtn=False)
searches a range shrink per group."""
import torch

from auto_round.data_type.int import quant_tensor_asym, quant_tensor_sym
from auto_round.utils import set_module


def round_ste(x):
    return x + (torch.round(x) - x).detach()


class WrapperLinear(torch.nn.Module):
    def __init__(self, orig_layer, enable_minmax_tuning=True, enable_norm_bias_tuning=False, device="cpu",
                 enable_round_tuning=True, enable_torch_compile=False, disable_opt_rtn=True, **kwargs):
        super().__init__()
        self.orig_layer = orig_layer
        self.orig_layer.iters = kwargs.pop("iters", 200)
        self.device = orig_layer.tuning_device if hasattr(orig_layer, "tuning_device") else device
        self.disable_opt_rtn = disable_opt_rtn
        self.q_scale_thresh = 1e-8 if getattr(orig_layer, "scale_dtype", None) == torch.float32 else 1e-5
        self.enable_round_tuning, self.enable_minmax_tuning = enable_round_tuning, enable_minmax_tuning
        self._init_tuning_params_and_quant_func()

    def _init_tuning_params_and_quant_func(self):
        rows, cols = self.orig_layer.weight.shape
        group_len = cols if self.orig_layer.group_size == -1 else self.orig_layer.group_size
        groups = rows * cols // group_len
        self.params = {}
        self._init("value", (groups, group_len), 0.0, self.enable_round_tuning)
        self._init("min_scale", (groups,), 1.0, self.enable_minmax_tuning)
        self._init("max_scale", (groups,), 1.0, self.enable_minmax_tuning)
        self.weight_quant_func = quant_tensor_sym if getattr(self.orig_layer, "sym", True) else quant_tensor_asym

    def _init(self, name, shape, value, tunable):
        if tunable:
            p = torch.nn.Parameter(torch.full(shape, value, device=self.device), requires_grad=True)
            self.params[name] = p
        else:
            p = torch.tensor(value, device=self.device)
        setattr(self, name, p)

    def _qdq_weight(self, value, min_scale, max_scale):
        """(quant-dequantized weight, scale, zero point)."""
        layer = self.orig_layer
        if self.disable_opt_rtn:
            return self.weight_quant_func(layer.weight.to(self.device), layer.bits, layer.group_size, value, min_scale,
                                          max_scale, getattr(layer, "scale_dtype", torch.float16), self.q_scale_thresh)
        min_scale.data.clamp_(0, 1)
        max_scale.data.clamp_(0, 1)
        w = layer.weight.to(self.device).float()
        rows, cols = w.shape
        g = w.reshape(rows, -1, layer.group_size)
        maxq = 2 ** layer.bits - 1
        lo, hi = torch.clamp(g.amin(-1), max=0), torch.clamp(g.amax(-1), min=0)
        shrinks = [1.0 - 0.05 * k for k in range(6)]
        weights = layer.imatrix.to(w.device).reshape(1, -1, layer.group_size) if hasattr(layer, "imatrix") else 1.0
        best, best_err, best_scale, best_zero = None, None, None, None
        for shrink in shrinks:  # optimized RTN: the range shrink with the least (imatrix-weighted) error per group
            scale = torch.clamp((hi * max_scale * shrink - lo * min_scale * shrink) / maxq, min=1e-9).unsqueeze(-1)
            zero = round_ste(-lo.unsqueeze(-1) * min_scale.unsqueeze(-1) * shrink / scale)
            offset = value if value.dim() == 0 else value.reshape_as(g)
            q = torch.clamp(round_ste(g / scale + offset) + zero, 0, maxq)
            dq = (q - zero) * scale
            err = ((dq - g) ** 2 * weights).sum(-1, keepdim=True)
            if best is None:
                best, best_err, best_scale, best_zero = dq, err, scale, zero
            else:
                take = err < best_err
                best, best_err = torch.where(take, dq, best), torch.minimum(err, best_err)
                best_scale, best_zero = torch.where(take, scale, best_scale), torch.where(take, zero, best_zero)
        return best.reshape(rows, cols).to(layer.weight.dtype), best_scale, best_zero

    def forward(self, x):
        w, _, _ = self._qdq_weight(self.value, self.min_scale, self.max_scale)
        return torch.nn.functional.linear(x, w, self.orig_layer.bias)

    def unwrapper(self, best_params):
        best_params = best_params or {}
        v = best_params.get("value", torch.tensor(0.0)).to(self.device)
        mn = best_params.get("min_scale", torch.tensor(1.0)).to(self.device)
        mx = best_params.get("max_scale", torch.tensor(1.0)).to(self.device)
        with torch.no_grad():
            w, scale, zp = self._qdq_weight(v, mn.clone(), mx.clone())
            self.orig_layer.weight.data.copy_(w)
        self.orig_layer.weight.grad = None
        rows = w.shape[0]
        self.orig_layer.scale = scale.reshape(rows, -1).to("cpu") if scale.numel() > 1 else scale.view(-1).to("cpu")
        if isinstance(zp, torch.Tensor):
            zp = zp.reshape(rows, -1).to("cpu") if zp.numel() > 1 else zp.view(-1).to("cpu")
        self.orig_layer.zp = zp
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
