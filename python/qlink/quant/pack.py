"""GPTQ's packed storage: a layer's 2/4/8-bit codes in int32 words, in the layout GPTQModel's
quantized linears keep (`qweight` packs 32 / bits input columns to a word, `qzeros` 32 / bits
output columns), made as GPTQModel's own packer makes it: each code recomputed from the
quantized weight, round((w + zero * scale) / scale) clamped to [0, 2^bits - 1], in the
dtypes torch promotes those tensors to. The same operations on either device round alike
(IEEE adds and divides, round half to even), so a GPU packs what GPTQModel's CPU packer
packs, bit for bit, in one pass over the layer instead of a Python loop over its 32-column
blocks."""
import threading

import torch

_MASK32 = (1 << 32) - 1
_streams = threading.local()  # per thread, per device: the stream a pack runs on


def gptq_pack(weight, scales, zeros, g_idx, bits, device=None):
    """(qweight (in * bits / 32, out), qzeros (groups, out * bits / 32)), int32, computed on
    `device` (default the weight's) and returned where the weight is; a CUDA device packs on a
    stream of the calling thread's own and waits for it, so a finalizer thread packing host
    tensors never queues behind the layer loop's kernels (GPU tensors are read after the
    work their devices' current streams had queued).

    weight (out, in), the quantized layer's weight as its linear holds it; scales and zeros
    (groups, out); g_idx (in,), each input column's group (negative counts from the end).
    ValueError naming the argument for a shape, a bit width or a value the layout cannot hold
    (zeros not integers in [0, 2^bits - 1], a zero or non-finite scale or weight, a group out
    of range): nothing is packed then."""
    _check_shapes(weight, scales, zeros, g_idx, bits)
    device = torch.device(device) if device is not None else weight.device

    def pack():
        qweight, qzeros, refusals = _pack(*(t.unsqueeze(0) for t in (weight, scales, zeros, g_idx)), bits, device)
        if refusals[0]:
            raise ValueError(refusals[0])
        return qweight[0].to(weight.device), qzeros[0].to(weight.device)
    if device.type != "cuda":
        return pack()
    stream = _stream(device)
    # GPU inputs may still be written by the caller's stream: the pack follows it. Host
    # inputs (a finalizer's) are read by the pack's own copies, behind nothing the layer
    # loop has queued.
    for caller in {t.device for t in (weight, scales, zeros, g_idx) if t.is_cuda}:
        stream.wait_stream(torch.cuda.current_stream(caller))
    with torch.cuda.stream(stream):
        words = pack()
    stream.synchronize()
    for t in words:  # made on the pack's stream, read on the caller's: freed only after that work
        if t.is_cuda:
            t.record_stream(torch.cuda.current_stream(t.device))
    return words


def gptq_pack_many(weights, scales, zeros, g_idx, bits, chunk_elements=1 << 26):
    """gptq_pack of several same-shaped layers at once, on their device and its current
    stream, in batches of about `chunk_elements` weight elements: (qweight (n, in * bits /
    32, out), qzeros (n, groups, out * bits / 32), refusals), refusals[i] None where layer
    i packed, else the ValueError message gptq_pack would raise for it (its words are then
    not to be used). Each layer's words are gptq_pack's of it, bit for bit; shapes are
    checked as gptq_pack checks them."""
    if not weights or not len(weights) == len(scales) == len(zeros) == len(g_idx):
        raise ValueError("weights, scales, zeros and g_idx: %d, %d, %d and %d layers, where one or more of each "
                         "was expected" % (len(weights), len(scales), len(zeros), len(g_idx)))
    for layer in zip(weights, scales, zeros, g_idx):
        _check_shapes(*layer, bits)
        if layer[0].shape != weights[0].shape or layer[1].shape != scales[0].shape:
            raise ValueError("weights: shapes %s and %s in one batch, where all must be alike"
                             % (tuple(weights[0].shape), tuple(layer[0].shape)))
    device = weights[0].device
    per = max(1, chunk_elements // weights[0].numel())
    qweights, qzeros, refusals = [], [], []
    for at in range(0, len(weights), per):
        part = slice(at, at + per)
        made = _pack(*(torch.stack([t.to(device) for t in ts[part]]) for ts in (weights, scales, zeros, g_idx)),
                     bits, device)
        qweights.append(made[0])
        qzeros.append(made[1])
        refusals += made[2]
    return torch.cat(qweights), torch.cat(qzeros), refusals


def _check_shapes(weight, scales, zeros, g_idx, bits):
    if bits not in (2, 4, 8):
        raise ValueError("bits: %r, where 32-bit words hold 2-, 4- or 8-bit codes" % (bits,))
    if weight.dim() != 2:
        raise ValueError("weight: %d dimensions, where a linear's (out, in) has 2" % weight.dim())
    out_features, in_features = weight.shape
    if in_features % 32 or out_features % 32:
        raise ValueError("weight: shape %s, where both sides must be multiples of 32" % (tuple(weight.shape),))
    if scales.dim() != 2 or scales.shape[1] != out_features:
        raise ValueError("scales: shape %s, where (groups, %d) was expected" % (tuple(scales.shape), out_features))
    if tuple(zeros.shape) != tuple(scales.shape):
        raise ValueError("zeros: shape %s, where scales' %s was expected" % (tuple(zeros.shape), tuple(scales.shape)))
    if g_idx.dim() != 1 or g_idx.numel() != in_features:
        raise ValueError("g_idx: shape %s, where (%d,) was expected" % (tuple(g_idx.shape), in_features))
    if g_idx.dtype.is_floating_point or g_idx.dtype.is_complex or g_idx.dtype == torch.bool:
        raise ValueError("g_idx: dtype %s, where group indices are integers" % g_idx.dtype)


def _stream(device):
    streams = getattr(_streams, "by_device", None)
    if streams is None:
        streams = _streams.by_device = {}
    if device not in streams:
        streams[device] = torch.cuda.Stream(device)
    return streams[device]


def _pack(weight, scales, zeros, g_idx, bits, device):
    """(qweight, qzeros, refusals) of n layers: weight (n, out, in), scales and zeros (n,
    groups, out), g_idx (n, in); refusals[i] the message for a value layer i cannot hold."""
    n, groups, out_features = scales.shape
    maxq = (1 << bits) - 1
    per_word = 32 // bits
    w, s, z = weight.to(device), scales.to(device), zeros.to(device)
    g = g_idx.to(device=device, dtype=torch.int64)
    g = torch.where(g < 0, g + groups, g)
    cols = g.clamp(0, groups - 1).unsqueeze(-1).expand(-1, -1, out_features)  # in range; outside refused below
    s_cols, sz_cols = s.gather(1, cols).transpose(1, 2), (z * s).gather(1, cols).transpose(1, 2)
    codes = torch.round((w + sz_cols) / s_cols).clamp_(0, maxq).nan_to_num_(0)
    shifts = torch.arange(per_word, device=device, dtype=torch.int64) * bits
    codes = codes.to(torch.int32).transpose(1, 2).to(torch.int64)  # (n, in, out): a word's codes are adjacent rows
    qweight = (codes.reshape(n, -1, per_word, out_features) << shifts.view(1, 1, -1, 1)).sum(2) & _MASK32
    zeros = torch.where(torch.isfinite(z), z, 0).to(torch.int64)
    qzeros = (zeros.reshape(n, groups, -1, per_word) << shifts).sum(-1) & _MASK32
    # The inputs' checks read once, after the words are made (one host read a batch): a
    # refused layer's words are not to be used.
    bad = torch.stack([
        ((g < 0) | (g >= groups)).flatten(1).any(1),
        ~torch.isfinite(w).flatten(1).all(1),
        ((s == 0) | ~torch.isfinite(s)).flatten(1).any(1),
        ((z != torch.round(z)) | (z < 0) | (z > maxq) | ~torch.isfinite(z)).flatten(1).any(1),
    ], 1).tolist()
    messages = ("g_idx: a group outside [-%d, %d)" % (groups, groups), "weight: a non-finite value",
                "scales: a zero or non-finite scale", "zeros: a value that is not an integer in [0, %d]" % maxq)
    refusals = [next((m for flagged, m in zip(flags, messages) if flagged), None) for flags in bad]
    return qweight.to(torch.int32), qzeros.to(torch.int32), refusals
