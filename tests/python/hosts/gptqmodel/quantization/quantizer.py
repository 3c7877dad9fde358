"""Stand-in for gptqmodel.quantization.quantizer.Quantizer: per-row min-max affine grids."""
import torch

from .config import QuantizeConfig


class Quantizer(torch.nn.Module):
    def __init__(self, qcfg=None, name=None):
        super().__init__()
        self.qcfg = qcfg or QuantizeConfig()
        self.name = name
        self.perchannel = False
        self.maxq = 2 ** self.qcfg.bits - 1

    def requires_groupwise_processing(self):
        return False

    def configure(self, perchannel=False):
        self.perchannel = perchannel
        self.maxq = 2 ** self.qcfg.bits - 1

    def find_params(self, x, weight=False):
        xmin = torch.clamp(x.min(dim=1).values, max=0)
        xmax = torch.clamp(x.max(dim=1).values, min=0)
        if self.qcfg.sym:
            xmax = torch.maximum(xmin.abs(), xmax)
            xmin = torch.where(xmin < 0, -xmax, xmin)
        flat = (xmin == 0) & (xmax == 0)
        xmin, xmax = torch.where(flat, -torch.ones_like(xmin), xmin), torch.where(flat, torch.ones_like(xmax), xmax)
        self.scale = ((xmax - xmin) / self.maxq).unsqueeze(1)
        if self.qcfg.sym:
            self.zero = torch.full_like(self.scale, (self.maxq + 1) / 2)
        else:
            self.zero = torch.round(-xmin / self.scale.squeeze(1)).unsqueeze(1)

    def quantize(self, x):
        q = torch.clamp(torch.round(x / self.scale) + self.zero, 0, self.maxq)
        return self.scale * (q - self.zero)
