"""Stand-in for device-smi: a device's memory and utilization from PyTorch / psutil."""
import types

import psutil
import torch


class Device:
    def __init__(self, device):
        self.device = torch.device(device) if not isinstance(device, torch.device) else device
        gpu = self.device.type == "cuda"
        self.type = self.device.type
        self.model = torch.cuda.get_device_name(self.device) if gpu else "cpu"
        self.memory_total = torch.cuda.get_device_properties(self.device).total_memory if gpu else \
            psutil.virtual_memory().total

    def memory_used(self):
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            return total - free
        return psutil.Process().memory_info().rss

    def utilization(self):
        return 0.0

    def metrics(self, fast=False):
        """A reading: memory_used in bytes, utilization in percent."""
        return types.SimpleNamespace(memory_used=self.memory_used(), utilization=self.utilization())

    def close(self):
        return None
