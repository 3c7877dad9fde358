"""AutoRound's optimized-RTN scale search (auto_round.data_type.int.search_scales: at iters=0,
each group's scale tried at 200 candidate ranges, weighted by the layer's imatrix) without
a host read per candidate and with candidates evaluated a chunk at a time. AutoRound keeps a
better candidate's scales by boolean-mask writes behind `if mask.any()`: two waits for the GPU
a candidate, 400 a layer, so the GPU idles while Python launches the next candidate's dozen
kernels (bench/RESULTS.md). Here a chunk's candidates take one pass of those kernels over
(candidates, groups, group size) and the best of the chunk is kept by torch.where.

Invariant: the candidates, their order and each candidate's arithmetic are AutoRound's
operation for operation (each candidate's inverse scale is AutoRound's scalar product with
the groups' reciprocal maxima, the elementwise steps the same, each group's loss summed over
its own columns), and a candidate replaces the kept one only where its loss is strictly
lower than every earlier one's (the chunk's first minimum against the kept loss), so the
scales are AutoRound's bit for bit."""
import torch

from ..patches import eager, like
from .contract import CONTRACT

PATCH = "scale_search"
CHUNK_CANDIDATES = 16  # candidates a pass
CHUNK_ELEMENTS = 1 << 25  # and at most this many (candidate, weight) elements a pass: 128 MiB of fp32


@CONTRACT.copies("auto_round/data_type/int.py", "search_scales", "f342f7600cf270f3")
def search_scales(data, bits, qw, get_reciprocal, search_ratio):
    """AutoRound's search_scales(data, bits, qw) with its module's get_reciprocal and
    AR_SEARCH_SCALE_RATIO (`search_ratio`, None for its default)."""
    nmax = int(2.0 ** (bits - 1))
    imax = torch.abs(data).argmax(dim=-1, keepdim=True)
    group_max = torch.take_along_dim(data, imax, dim=-1)
    reciprocal = get_reciprocal(group_max)
    iscales = -nmax * reciprocal
    scales = get_reciprocal(iscales)
    weighted = isinstance(qw, torch.Tensor)

    def loss_of(candidate_iscales, candidate_scales):
        levels = torch.empty(candidate_iscales.shape[:-1] + data.shape[-1:], dtype=data.dtype, device=data.device)
        torch.round(candidate_iscales * data, out=levels)
        levels.clamp_(-nmax, nmax - 1)
        loss = ((candidate_scales * levels - data).to(torch.float32)) ** 2
        if weighted:
            loss.mul_(qw)
        return torch.sum(loss, dim=-1)

    best_loss = loss_of(iscales, scales)
    if bits == 2:
        search_min, step = 18 * 5, 0.01
    else:
        search_min = nmax * (search_ratio or 0.75)
        step = search_min / 200 * 2
        search_min = int(search_min / step)
    factors = [-(nmax - step * candidate) for candidate in range(-search_min, search_min + 1) if candidate != 0]
    chunk = max(1, min(CHUNK_CANDIDATES, CHUNK_ELEMENTS // max(1, data.numel())))
    for start in range(0, len(factors), chunk):
        candidate_iscales = torch.stack([factor * reciprocal for factor in factors[start:start + chunk]])
        candidate_scales = get_reciprocal(candidate_iscales)
        loss = loss_of(candidate_iscales, candidate_scales).nan_to_num_(float("inf"), float("inf"))  # NaN never wins
        chunk_loss, first = loss.min(dim=0)  # the first minimum: the earliest of equal losses
        better = chunk_loss < best_loss
        chosen = torch.take_along_dim(candidate_scales, first[None, ..., None], dim=0)[0]
        scales = torch.where(better.unsqueeze(-1), chosen, scales)
        best_loss = torch.where(better, chunk_loss, best_loss)
    return scales


def make_search_scales(installation, original):
    get_reciprocal = installation.names["auto_round.data_type.int:get_reciprocal"]
    envs = installation.names["auto_round.data_type.int:envs"]
    counters = installation.counters

    @eager  # AutoRound compiles its quant-dequant: the search stays eager, as AutoRound's own does
    @like(original)
    def search_scales_unsynced(data, bits, qw=None):
        counters.qlink(PATCH)
        return search_scales(data, bits, qw, get_reciprocal, envs.AR_SEARCH_SCALE_RATIO)
    return search_scales_unsynced
