"""Stand-in for gptqmodel.nn_modules.hooked_linear: HookedLinear's forward as GPTQModel's
runs it (the weight materialized, the input on its device, the online Hadamard where the
layer asks for one, the product, then the subset's hook and, on the subset's last module,
StopForward), with the module-level helpers it calls under their names."""
import torch


class StopForward(Exception):
    """Signal an intentional early stop of the forward pass."""


STOP_FORWARD_EXCEPTION = StopForward("Forwarding stopped")


def _restore_output_device(output, original_device):
    return output if output.device == original_device else output.to(device=original_device)


def _materialize_if_meta_weight(module, *, input_device):
    """GPTQModel's undoes a disk offload here; the stand-ins keep no offloaded weights."""


def emit_device_telemetry(event, **fields):
    """GPTQModel's logs device placements where asked to; nothing here."""


def apply_online_hadamard(input, *, online_full_had, online_partial_had, had_K, K, had_dim):
    """GPTQModel's rotates the input for rotated models; the stand-ins are never rotated."""
    return input


class HookedLinear(torch.nn.Linear):
    def __init__(self, in_features, out_features):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.forward_hook, self.forward_hook_last, self.module_name = None, False, None

    @staticmethod
    def from_linear(linear):
        hooked = HookedLinear(linear.in_features, linear.out_features)
        hooked.weight, hooked.bias = linear.weight, linear.bias
        return hooked

    @torch.inference_mode()
    def forward(self, input):
        original_device = input.device
        _materialize_if_meta_weight(self, input_device=original_device)
        target_device = self.weight.data.device
        emit_device_telemetry("hooked_linear_forward", module=self.module_name or "unknown",
                              weight_device=target_device, input_device=original_device)
        if original_device != target_device:
            input = input.to(device=target_device)
        input = apply_online_hadamard(input, online_full_had=False, online_partial_had=False, had_K=None, K=1,
                                      had_dim=-1)
        output = super().forward(input)
        if self.forward_hook:
            self.forward_hook(self, (input,), output)
            if self.forward_hook_last:
                raise STOP_FORWARD_EXCEPTION.with_traceback(None)
        return _restore_output_device(output, original_device)
