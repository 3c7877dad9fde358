"""The AutoRound rules qlink's block tuning restates (its native loop and its data-parallel
loop alike), each pinned to the host function it copies (qlink.integrations.contracts):
the learning rates of a layer's groups, the cached valid-token mask, the batch an
iteration draws, what a one-device dispatch leaves on the quantizer."""
from ..contracts import Contract

CONTRACT = Contract("AutoRound")
_SIGN_ROUND = "auto_round/algorithms/quantization/sign_round/quantizer.py"


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
