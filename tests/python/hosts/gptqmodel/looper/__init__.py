from . import forward_executor, gptq_processor, module_looper  # noqa: F401
