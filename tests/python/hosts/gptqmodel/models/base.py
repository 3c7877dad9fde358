"""Stand-in for gptqmodel.models.base: BaseQModel's per-layer hooks of the layer stage
(pre_quantize makes a layer ready, post_quantize moves the finished one to the CPU), its
per-batch replay hooks (a model definition overrides them to carry state from batch to
batch), its batching flags and its MoE expert-count field."""


class BaseQModel:
    support_batch_quantize = True
    write_shared_kv_cache = False
    dynamic_expert_index = None  # an MoE definition names its config's expert count here

    def pre_quantize(self, module):
        return module

    def post_quantize(self, module):
        return module.to("cpu")

    def prepare_layer_replay_kwargs(self, layer, layer_input, additional_inputs, target_device):
        return additional_inputs

    def update_layer_replay_kwargs_from_output(self, layer, layer_output, layer_input_kwargs, target_device):
        return layer_input_kwargs
