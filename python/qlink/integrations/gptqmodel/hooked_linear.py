"""A stopped subset's last linear, its product left uncomputed. GPTQModel's forward of a
subset hooks each of the subset's linears and raises StopForward right after the last one's
hook (forward_hook_last): that module's output reaches its hook and nothing else, and GPTQ's
hook reads its input alone (add_batch ignores the output). A LLaMA-7B layer's stopped
linears are v_proj, o_proj, up_proj and down_proj, one each of its four subset forwards: a
GEMM of each batch the loop computes and discards. Here, in a loop with GPTQ's processor
alone (GPTQLoop), such a module runs HookedLinear.forward's steps with the product an
uncomputed tensor of its shape (contract.stopped_forward); any other call is GPTQModel's."""
import torch

from ..patches import like
from .contract import stopped_forward

PATCH = "stopped_products"


def make_forward(installation, original):
    """HookedLinear.forward for `installation` (qlink.integrations.gptqmodel's)."""
    counters, helpers = installation.counters, installation.host.hooked_linear

    @like(original)
    def forward(module, input):
        if not (getattr(module, "forward_hook", None) and getattr(module, "forward_hook_last", False)):
            return original(module, input)
        if installation.loop.refusal:
            counters.host(PATCH, installation.loop.refusal)
            return original(module, input)
        counters.qlink(PATCH)
        with torch.inference_mode():
            return stopped_forward(module, input, helpers)
    return forward
