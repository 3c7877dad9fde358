"""Stand-in for gptqmodel.quantization.gptq.GPTQ: per-device Hessian partials merged in
arrival order, and GPTQ's column loop (lazy block updates) returning what the host's
quantize returns. As the host's: group_size -1 takes each row's range before the dead
columns (zero Hessian diagonal) are zeroed, static groups after, dynamic groups as each
group starts; static_groups does nothing with -1."""
import math
import threading
import time

import torch

from ..utils.fallback import should_use_fallback
from .config import QuantizeConfig
from .quantizer import Quantizer


class GPTQ:
    def __init__(self, module, qcfg=None):
        self.lock = threading.Lock()
        self.module, self.name = module, "layer"
        self.rows, self.columns = module.weight.shape
        self.qcfg = qcfg or QuantizeConfig()
        self.quantizer = Quantizer(self.qcfg, name=self.name)
        self.module_copy, self._tp_pad_cols = None, 0
        self.fallback, self.expected_nsamples = self.qcfg.fallback, None
        self.H, self.nsamples, self.fwd_counter = None, 0, 0
        self._device_hessian_partials, self._device_sample_counts = {}, {}
        self._hessian_dirty = False
        self._final_hessian_device_hint = module.weight.device
        module.target_device = module.weight.device

    def add_batch(self, inp, out=None, batch_index=None):
        x = inp.reshape(-1, inp.shape[-1]).float()
        xtx, dev = x.t() @ x, torch.device(inp.device)
        with self.lock:
            self.fwd_counter += 1
            if dev in self._device_hessian_partials:
                self._device_hessian_partials[dev].add_(xtx)
            else:
                self._device_hessian_partials[dev] = xtx
            self._device_sample_counts[dev] = self._device_sample_counts.get(dev, 0) + x.shape[0]
            self.nsamples += x.shape[0]
            self._hessian_dirty = True

    def _select_hessian_target_device(self, requested):
        return torch.device(requested) if requested is not None else torch.device(self._final_hessian_device_hint)

    def materialize_global_hessian(self, target_device=None):
        device = self._select_hessian_target_device(target_device)
        with self.lock:
            if not self._hessian_dirty and self.H is not None:
                return
            total = sum(self._device_sample_counts.values())
            accum = torch.zeros(self.columns, self.columns, device=device)
            for partial in self._device_hessian_partials.values():  # arrival order
                accum.add_(partial.to(device))
            self.H = accum.mul_(2.0 / max(total, 1))
            self.nsamples, self._hessian_dirty = total, False
            self._device_hessian_partials.clear()
            self._device_sample_counts.clear()

    def finalize_hessian(self, target_device=None):
        self.materialize_global_hessian(target_device)
        return self.H

    def quantize(self, blocksize=128):
        if should_use_fallback(self.fallback, float(self.nsamples), self.expected_nsamples):
            raise NotImplementedError("the stand-in has no fallback strategies")
        start = time.time()
        self.finalize_hessian(self.module.target_device)
        W = self.module.weight.data.float().clone()
        H = self.H.clone()
        self.quantizer.find_params(W, weight=True)  # as the host: the whole rows' range, before the dead columns go
        dead = torch.diag(H) == 0
        H[dead, dead] = 1
        W[:, dead] = 0
        group = self.qcfg.group_size
        static = []
        if self.qcfg.static_groups and group != -1:  # the host's static groups: ranges after the dead columns go
            for i in range(0, self.columns, group):
                self.quantizer.find_params(W[:, i:i + group], weight=True)
                static.append((self.quantizer.scale, self.quantizer.zero))
        damp = self.qcfg.damp_percent
        H += damp * torch.mean(torch.diag(H)) * torch.eye(self.columns)
        Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
        Q, losses = torch.zeros_like(W), torch.zeros_like(W)
        scales, zeros = [s for s, _ in static], [z for _, z in static]
        for i1 in range(0, self.columns, blocksize):
            i2 = min(i1 + blocksize, self.columns)
            W1, Err1 = W[:, i1:i2].clone(), torch.zeros(self.rows, i2 - i1)
            for i in range(i2 - i1):
                if static:
                    self.quantizer.scale, self.quantizer.zero = static[(i1 + i) // group]
                elif group != -1 and (i1 + i) % group == 0:
                    self.quantizer.find_params(W[:, i1 + i:i1 + i + group], weight=True)  # as the host: W, not W1
                    scales.append(self.quantizer.scale)
                    zeros.append(self.quantizer.zero)
                w, d = W1[:, i], Hinv[i1 + i, i1 + i]
                q = self.quantizer.quantize(w.unsqueeze(1)).flatten()
                Q[:, i1 + i], losses[:, i1 + i] = q, (w - q) ** 2 / d ** 2 / 2
                err = (w - q) / d
                W1[:, i:] -= err.unsqueeze(1) @ Hinv[i1 + i, i1 + i:i2].unsqueeze(0)
                Err1[:, i] = err
            W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
        avg_loss = torch.sum(losses).item() / self.nsamples
        if math.isnan(avg_loss):
            raise ValueError("NaN loss")
        if not scales:  # group_size -1: the range taken before the dead columns went
            scales.append(self.quantizer.scale)
            zeros.append(self.quantizer.zero)
        g_idx = torch.arange(self.columns, dtype=torch.int32) // (group if group != -1 else self.columns)
        del self.H
        return (Q.to(self.module.weight.dtype), torch.cat(scales, 1), torch.cat(zeros, 1), g_idx, time.time() - start,
                avg_loss, damp, self.nsamples)
