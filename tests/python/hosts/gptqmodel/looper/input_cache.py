from dataclasses import dataclass
from typing import Dict, List

import torch


@dataclass
class InputCache:
    """Stand-in for gptqmodel.looper.input_cache.InputCache: what the capture keeps."""

    layer_inputs: List[List[torch.Tensor]]
    layer_input_kwargs: List[Dict[str, torch.Tensor]]
    position_ids: List[torch.Tensor]
    attention_masks: List[torch.Tensor]
