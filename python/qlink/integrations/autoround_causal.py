"""AutoRound's calibration attention mask, given way to causal attention in the native
tuning loop where that changes nothing the tuning reads.

AutoRound masks the last token of every calibration sample out (its calib(): so the mask
is "never all ones"), so transformers hands each block a 4-D mask and SDPA computes every
score of the tokens' square, where causal attention (no mask, is_causal) skips the upper
half: at the issue's 8 x 2048 tokens on an H200 cuDNN takes 6.7 ms for the masked
forward and backward and 2.4 ms for the causal one (bench/attention_mask_cost.py).

The two agree on every query row whose mask row is the causal row. The tuning's loss reads
only AutoRound's valid tokens (its valid-token mask, which leaves that last token out); a
decoder block mixes positions only causally (a query reads keys at or before itself), so
when the valid tokens are a prefix of each sample and each valid row is the causal row, no
valid token ever reads a position where the two differ: the block's outputs there, the
loss and its gradients are the masked block's (up to the kernels' rounding)."""
import torch

_CHUNK = 8  # samples compared at once: a chunk's square of booleans, not the whole cache's


def _attention_refusal(block):
    attentions = [m for m in block.modules() if hasattr(m, "is_causal") and hasattr(m, "config")]
    if not attentions:
        return "no attention module with is_causal in the block"
    for m in attentions:
        implementation = getattr(m.config, "_attn_implementation", None)
        if implementation != "sdpa":
            return "attention implementation %r (causal without a mask is sdpa's)" % (implementation,)
        if m.is_causal is not True:
            return "an attention module that is not causal (%s)" % type(m).__name__
    return None


def _attends(mask):
    """The mask as booleans (True: the query reads the key), or a reason it cannot be."""
    if mask.dtype == torch.bool:
        return mask, None
    if not mask.is_floating_point():
        return None, "an attention mask of dtype %s" % mask.dtype
    blocked = mask <= torch.finfo(mask.dtype).min
    if not bool(((mask == 0) | blocked).all()):
        return None, "an attention mask with biases (entries other than 0 and the dtype's minimum)"
    return ~blocked, None


def causal_refusal(block, mask, valid, samples, tokens):
    """Why the block's tuning must keep its attention mask (None if causal attention gives
    the same loss and gradients). mask: input_others' attention_mask on the device
    (samples or 1, heads or 1, tokens, tokens); valid: AutoRound's valid-token mask as
    (samples, tokens) 0/1 rows, or None (every token read)."""
    if mask is None:
        return "no attention mask in the block's inputs"
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return "an attention mask that is not a 4-D tensor"
    if tuple(mask.shape[-2:]) != (tokens, tokens) or mask.shape[0] not in (1, samples):
        return "an attention mask of shape %s for %d samples of %d tokens" % (tuple(mask.shape), samples, tokens)
    reason = _attention_refusal(block)
    if reason:
        return reason
    read = torch.ones(samples, tokens, dtype=torch.bool, device=mask.device) if valid is None else valid.bool()
    if tuple(read.shape) != (samples, tokens):
        return "a valid-token mask of shape %s" % (tuple(read.shape),)
    if valid is not None and bool((read[:, 1:] & ~read[:, :-1]).any()):
        return "valid tokens after an ignored one (the loss would read what causal attention changes)"
    causal = torch.ones(tokens, tokens, dtype=torch.bool, device=mask.device).tril_()
    differs = torch.zeros((), dtype=torch.bool, device=mask.device)
    for start in range(0, mask.shape[0], _CHUNK):
        attends, reason = _attends(mask[start:start + _CHUNK])
        if reason:
            return reason
        rows = (attends != causal).any(-1)  # (chunk, heads, tokens): a query row that is not causal
        if mask.shape[0] == 1:
            differs |= (rows.any(1) & read).any()
        else:
            differs |= (rows.any(1) & read[start:start + rows.shape[0]]).any()
    if bool(differs):
        return "the mask hides keys from a token the loss reads (padding inside the sequence)"
    return None
