// `qlink demo`'s GPTQ part: a small synthetic Llama-shaped model quantized serially and
// data-parallel over every device of the context.
#pragma once

#include "plugin_api/qlink.h"

// Prints the serial and parallel times, the share of codes equal between them and each
// kind of layer's output error against round-to-nearest; 0 when the parallel result
// equals the serial one and GPTQ beats rounding on every layer.
int GptqDemo(const qlink_api& api, qlink_context* ctx);
