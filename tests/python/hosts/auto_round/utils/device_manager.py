"""Stand-in for auto_round.utils.device_manager: where AutoRound tunes (its home device)."""
import torch


class DeviceManager:
    def __init__(self):
        self.device = torch.device("cpu")
        self.device_list = [self.device]
        self.device_map = None


device_manager = DeviceManager()
