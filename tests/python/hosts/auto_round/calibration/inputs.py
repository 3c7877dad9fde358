"""Stand-in for auto_round.calibration.inputs.preprocess_block_inputs: a captured block's inputs
split into the first one and the others, each moved to AutoRound's cache device by to_device
(imported by name), element by element, single-element lists unwrapped."""
from auto_round.utils import to_device


def preprocess_block_inputs(inputs, *, compress_context, first_input_name="input_ids"):
    input_ids = inputs.pop(first_input_name, None)
    if input_ids is not None:
        input_ids = to_device(input_ids, compress_context.cache_device)
    input_others = to_device(inputs, compress_context.cache_device)
    for key, value in input_others.items():
        if isinstance(value, (list, tuple)) and len(value) == 1:
            input_others[key] = value[0]
    return input_ids, input_others
