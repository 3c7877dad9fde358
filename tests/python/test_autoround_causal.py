"""qlink.integrations.autoround_causal: when AutoRound's calibration attention mask may give
way to causal attention in the native tuning loop (every query row the loss reads is the
causal row, the read tokens a prefix, the block's attention sdpa and causal), and each
reason it may not."""
import types

import torch

from qlink.integrations.autoround_causal import causal_refusal

SAMPLES, TOKENS = 5, 7


class Attention(torch.nn.Module):
    is_causal = True

    def __init__(self, implementation="sdpa"):
        super().__init__()
        self.config = types.SimpleNamespace(_attn_implementation=implementation)


class Block(torch.nn.Module):
    def __init__(self, implementation="sdpa"):
        super().__init__()
        self.self_attn = Attention(implementation)
        self.mlp = torch.nn.Linear(4, 4)


def autoround_mask(samples=SAMPLES, hidden_tail=1):
    """transformers' 4-D sdpa mask for AutoRound's padding mask: causal, each sample's last
    `hidden_tail` keys hidden from every query."""
    keys = torch.ones(samples, TOKENS, dtype=torch.bool)
    keys[:, TOKENS - hidden_tail:] = False
    return torch.ones(TOKENS, TOKENS, dtype=torch.bool).tril()[None, None] & keys[:, None, None, :]


def valid_rows(ignored_tail=1):
    """AutoRound's valid-token mask: 0 on each sample's ignored tail (its last token)."""
    rows = torch.ones(SAMPLES, TOKENS, dtype=torch.long)
    rows[:, TOKENS - ignored_tail:] = 0
    return rows


def additive(mask):
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)


def test_autorounds_mask_gives_way_where_the_loss_reads_only_causal_rows():
    assert causal_refusal(Block(), autoround_mask(), valid_rows(), SAMPLES, TOKENS) is None
    assert causal_refusal(Block(), additive(autoround_mask()), valid_rows(), SAMPLES, TOKENS) is None
    # one mask every sample shares; a longer hidden tail the loss ignores too
    assert causal_refusal(Block(), autoround_mask(1), valid_rows(), SAMPLES, TOKENS) is None
    assert causal_refusal(Block(), autoround_mask(hidden_tail=3), valid_rows(3), SAMPLES, TOKENS) is None


def test_a_row_the_loss_reads_that_is_not_causal_keeps_the_mask():
    # no valid-token mask: the loss reads the last token, whose row hides its own key
    reason = causal_refusal(Block(), autoround_mask(), None, SAMPLES, TOKENS)
    assert "hides keys from a token the loss reads" in reason
    # a tail hidden longer than the loss ignores
    assert "hides keys" in causal_refusal(Block(), autoround_mask(hidden_tail=2), valid_rows(1), SAMPLES, TOKENS)
    # only one sample's row differs
    mask = autoround_mask()
    mask[3, 0, 4, 2] = False
    assert "hides keys" in causal_refusal(Block(), mask, valid_rows(), SAMPLES, TOKENS)


def test_padding_before_read_tokens_keeps_the_mask():
    mask = torch.ones(TOKENS, TOKENS, dtype=torch.bool).tril()[None, None].repeat(SAMPLES, 1, 1, 1)
    mask[:, :, :, 0] = False  # left padding: the first key hidden
    rows = torch.ones(SAMPLES, TOKENS, dtype=torch.long)
    rows[:, 0] = 0
    assert "valid tokens after an ignored one" in causal_refusal(Block(), mask, rows, SAMPLES, TOKENS)


def test_attention_that_is_not_sdpa_or_not_causal_keeps_the_mask():
    assert "'eager'" in causal_refusal(Block("eager"), autoround_mask(), valid_rows(), SAMPLES, TOKENS)
    block = Block()
    block.self_attn.is_causal = False
    assert "not causal" in causal_refusal(block, autoround_mask(), valid_rows(), SAMPLES, TOKENS)
    assert "no attention module" in causal_refusal(torch.nn.Linear(4, 4), autoround_mask(), valid_rows(),
                                                   SAMPLES, TOKENS)


def test_masks_it_cannot_read_keep_the_mask():
    biased = additive(autoround_mask())
    biased[0, 0, 3, 1] = -2.5  # a bias (ALiBi-like), not a hidden key
    assert "biases" in causal_refusal(Block(), biased, valid_rows(), SAMPLES, TOKENS)
    assert "dtype torch.int64" in causal_refusal(Block(), autoround_mask().long(), valid_rows(), SAMPLES, TOKENS)
    assert "no attention mask" in causal_refusal(Block(), None, valid_rows(), SAMPLES, TOKENS)
    assert "not a 4-D tensor" in causal_refusal(Block(), autoround_mask()[:, 0], valid_rows(), SAMPLES, TOKENS)
    reason = causal_refusal(Block(), autoround_mask(), valid_rows()[:4], 4, TOKENS)
    assert "of shape (5, 1, 7, 7) for 4 samples" in reason
