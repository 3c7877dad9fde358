from . import forward_executor, gptq_processor, module_looper, named_module, stage_layer, stage_subset  # noqa: F401
