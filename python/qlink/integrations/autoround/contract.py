"""The AutoRound rules qlink's block tuning restates (its native loop and its data-parallel
loop alike), each pinned to the host function it copies (qlink.integrations.contracts):
the learning rates of a layer's groups, the cached valid-token mask, the batch an
iteration draws, what a one-device dispatch leaves on the quantizer, which layers a
block's wrap takes, a layer's RTN, which layers' unwraps may be stacked by rows, and the
imatrix optimized RTN's forward hooks collect."""
import torch

from ..contracts import Contract

CONTRACT = Contract("AutoRound")
_SIGN_ROUND = "auto_round/algorithms/quantization/sign_round/quantizer.py"
_WRAPPER = "auto_round/wrapper.py"
_INT = "auto_round/data_type/int.py"


@CONTRACT.copies(_SIGN_ROUND, "SignRoundQuantizer.quantize_block", "9350ddef06b5b08f")
def learning_rates(q, bits, log=False):
    """(the rounding offsets' lr, the range factors' lr) of a layer of `bits` bits: the
    config's per-bit rates, the quantizer's own where it has none; log: AutoRound's note
    on low-bit rates."""
    lr = q._config.compute_lr(bits)
    if log:
        q._maybe_log_low_bit_lr(bits)
    minmax_lr = q._config.compute_minmax_lr(bits)
    return (q.lr if lr is None else lr), (q.minmax_lr if minmax_lr is None else minmax_lr)


@CONTRACT.copies(_SIGN_ROUND, "SignRoundQuantizer.quantize_block", "9350ddef06b5b08f")
def valid_token_mask(q, input_ids):
    """The loss's valid-token mask of these token ids, computed once and cached on the
    quantizer (None without token ids)."""
    if input_ids is None:
        return None
    if not hasattr(q, "_cached_valid_token_mask"):
        q._cached_valid_token_mask = q._compute_valid_token_mask(input_ids)
    return q._cached_valid_token_mask


@CONTRACT.copies(_SIGN_ROUND, "SignRoundQuantizer.quantize_block", "9350ddef06b5b08f")
def global_batch_size(q, nsamples):
    """How many samples an iteration draws: its sub-batches', at most every sample."""
    return min(nsamples, q.calibration_context.batch_size * q.gradient_accumulate_steps)


@CONTRACT.copies(_SIGN_ROUND, "SignRoundQuantizer.dispatch_block", "3d354b8f425ab1f6")
def dispatched(q, device):
    """What a block's dispatch to one device leaves on the quantizer for its tuning."""
    q._card_0_in_high_risk, q._loss_device = False, device


@CONTRACT.copies(_WRAPPER, "wrapper_block", "908bee47229d8a7b")
def wrapped_layers(host, block):
    """wrapper_block's split of a block's layers: ([(name, layer)] it wraps, [names] it
    leaves unquantized), in its order (its norm wrapping, for enable_norm_bias_tuning, which
    the native loop does not cover, aside)."""
    quantized, unquantized = [], []
    for name, m in block.named_modules():
        if type(m) in tuple(host.SUPPORTED_LAYER_TYPES):
            if host.check_to_quantized(m):
                quantized.append((name, m))
            else:
                unquantized.append(name)
    return quantized, unquantized


@CONTRACT.copies("auto_round/algorithms/quantization/base.py", "BaseQuantizer._quantize_layer_via_rtn",
                 "90c942d12fe1e7e0")
def plain_rtn(q, host, layer, disable_opt_rtn):
    """(the tuning device, WrapperLinear's keyword arguments) of AutoRound's RTN of `layer`
    where it is plain RTN (optimized RTN turned off, by the caller or, for an MoE model's
    routed experts, by AutoRound, which says so once), else None (an imatrix search per
    layer). A layer grouped_unwrap stacks needs nothing else of it: the conversion returns
    it as it is (no quantized_weight_type or config), set_module puts back what is there
    and .to() finds it on the device."""
    if disable_opt_rtn is None:
        disable_opt_rtn = bool(getattr(q.config, "disable_opt_rtn", False))
    if (not disable_opt_rtn and getattr(q.config, "orig_disable_opt_rtn", None) is None
            and q.model_context.is_moe_model and "expert" in layer.global_name
            and "shared_expert" not in layer.global_name and q.config.super_bits is None):
        disable_opt_rtn = True
        host.logger.warning_once("MoE layer detected: optimized RTN is disabled for efficiency. "
                                 "Use `--enable_opt_rtn` to force-enable it for MoE layers.")
    if not disable_opt_rtn:
        return None
    device = layer.tuning_device if hasattr(layer, "tuning_device") else host.device_manager.device
    return device, dict(device=device, enable_minmax_tuning=False, enable_norm_bias_tuning=False,
                        enable_round_tuning=False, enable_torch_compile=q.compress_context.enable_torch_compile,
                        disable_opt_rtn=True, iters=0)


@CONTRACT.copies(_WRAPPER, "WrapperLinear.unwrapper", "d39d7bba79ad8443")
@CONTRACT.copies(_WRAPPER, "WrapperLinear._qdq_weight", "86e27043f44be127")
@CONTRACT.copies(_WRAPPER, "WrapperLinear._init_tuning_params_and_quant_func", "caa3eae77a9bd497")
@CONTRACT.copies("auto_round/data_type/utils.py", "reshape_pad_tensor_by_group_size", "d36b7188c18c844b")
@CONTRACT.copies(_INT, "quant_tensor_sym", "0fe036211a059004")
@CONTRACT.copies(_INT, "quant_tensor_asym", "aeac945da1346ca2")
@CONTRACT.copies(_INT, "quant_tensor_rtn_sym", "d1d9b1ce1a24c515")
def row_stacking_refusal(state, shape):
    """Why a layer with these attributes (`state`) and weight `shape` cannot be unwrapped
    with others by stacking their rows, or None. The unwrap of an int layer (data_type int, an
    int group size, no activation quantization, super groups or global scale) computes each
    group of group_size columns of a row on its own (its range, scale and zero point, with the
    rounding offsets and range factors of that group), ignores an imatrix (plain RTN and the
    tuned quant-dequant), and writes the weight, scale and zp by rows and iters: stacked rows
    give each layer its own. A one-group weight's scale is written flat, not by rows."""
    group_size, (rows, cols) = state.get("group_size"), shape
    checks = [
        (state.get("data_type") != "int", "data_type %r" % (state.get("data_type"),)),
        (not isinstance(group_size, int) or group_size == 0, "group_size %r" % (group_size,)),
        ((state.get("act_bits") or 16) <= 8, "activation quantization (act_bits %s)" % (state.get("act_bits"),)),
        (any(state.get(k) is not None for k in ("super_bits", "weight_global_scale")),
         "super groups or a global scale"),
        (rows == 1 and (group_size == -1 or group_size >= cols), "a one-group weight"),
    ]
    return next((why for failed, why in checks if failed), None)


_COLLECTOR = "OptimizedRTNQuantizer._register_imatrix_hooks.<locals>.collect_imatrix"


@CONTRACT.copies("auto_round/algorithms/quantization/rtn/quantizer.py", "OptimizedRTNQuantizer._register_imatrix_hooks",
                 "7c46879ef4c4d20d")
def imatrix_hook(hook):
    """Whether forward hook `hook` is AutoRound's imatrix collector: (True, with_count), else
    (False, None). It adds the fp32 sum of its layer's input rows squared to the layer's
    imatrix (made by the first call) and, with_count, the rows to its imatrix_cnt."""
    if getattr(hook, "__qualname__", None) != _COLLECTOR:
        return False, None
    cells = dict(zip(hook.__code__.co_freevars, hook.__closure__ or ()))
    return ("with_count" in cells), (bool(cells["with_count"].cell_contents) if "with_count" in cells else None)


@CONTRACT.copies("auto_round/algorithms/quantization/rtn/quantizer.py", "OptimizedRTNQuantizer._register_imatrix_hooks",
                 "7c46879ef4c4d20d")
def add_imatrix(module, squared, rows, with_count):
    """The collector's effect of one call of `module` on `rows` input rows whose squares sum
    to `squared` (fp32, one per input column)."""
    if not hasattr(module, "imatrix"):
        module.imatrix = squared
        if with_count:
            module.imatrix_cnt = rows
        return
    module.imatrix += squared.to(module.imatrix.device)
    if with_count:
        module.imatrix_cnt += rows


@CONTRACT.copies("auto_round/algorithms/quantization/rtn/quantizer.py", "OptimizedRTNQuantizer._register_imatrix_hooks",
                 "7c46879ef4c4d20d")
def add_imatrices(additions):
    """add_imatrix of each of `additions` [(module, squared, rows, with_count)] in their order:
    the sums onto imatrices already on their squared's device and dtype in foreach adds (the
    same fp32 additions, in the same order, not one launch each), a new imatrix its squared's
    own copy."""
    grown, onto, pending = [], [], set()  # pending: the ids of grown's imatrices (alive in it)

    def flush():
        if grown:
            torch._foreach_add_(grown, onto)
        grown.clear()
        onto.clear()
        pending.clear()

    for module, squared, rows, with_count in additions:
        imatrix = vars(module).get("imatrix")
        if imatrix is not None and id(imatrix) in pending:
            flush()  # a second addition onto one imatrix comes after the first
        if imatrix is None or imatrix.device != squared.device or imatrix.dtype != squared.dtype:
            add_imatrix(module, squared.clone() if imatrix is None else squared, rows, with_count)
            continue
        grown.append(imatrix)
        onto.append(squared)
        pending.add(id(imatrix))
        if with_count:
            module.imatrix_cnt += rows
    flush()
