"""Stand-in for the parts of GPTQModel's QuantizeConfig a GPTQ task reads."""
import dataclasses


@dataclasses.dataclass
class QuantizeConfig:
    bits: int = 4
    group_size: int = 128
    sym: bool = True
    desc_act: bool = False
    static_groups: bool = False
    damp_percent: float = 0.05
    damp_auto_increment: float = 0.01
    mse: float = 0.0
    act_group_aware: bool = False
    mock_quantization: bool = False
    fallback: object = None
    dynamic: object = None
