"""bench/hosts/trained_model.py's parts that run without a GPU: its RTN is GPTQModel's
symmetric min-max grid group by group (the stand-in Quantizer, shaped like GPTQModel's), and
its calibration windows are seeded slices of the token stream; corpus.py's split is by file,
the same on every run, and keeps held-out text out of training."""
import os
import sys

import pytest
import torch

from qlink.integrations import gptqmodel as adapter

from stand_in_hosts import stand_in

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "hosts"))
import corpus  # noqa: E402 (bench/hosts)
import trained_model  # noqa: E402


@pytest.mark.parametrize("bits", [3, 4])
def test_rtn_is_gptqmodels_grid_group_by_group(bits):
    with stand_in("gptqmodel", adapter):
        from gptqmodel.quantization.config import QuantizeConfig
        from gptqmodel.quantization.quantizer import Quantizer
    torch.manual_seed(bits)
    weight = torch.randn(8, 512)
    weight[0, :128] = 0  # a group of zeros
    weight[1, 128:256] = weight[1, 128:256].abs()  # a group with no negative weight
    quantizer = Quantizer(QuantizeConfig(bits=bits, sym=True))
    expected = []
    for group in weight.reshape(-1, 128).split(1):
        quantizer.find_params(group, weight=True)
        expected.append(quantizer.quantize(group))
    assert torch.equal(trained_model.rtn(weight, bits), torch.cat(expected).reshape(weight.shape))
    assert len(torch.unique(trained_model.rtn(weight, bits)[2, :128])) <= 2 ** bits


def test_windows_are_seeded_slices_of_the_stream():
    ids = torch.arange(10000)
    a, b = trained_model.windows(ids, 6, 64, seed=1), trained_model.windows(ids, 6, 64, seed=1)
    assert torch.equal(a, b) and a.shape == (6, 64)
    assert all(torch.equal(row, torch.arange(row[0], row[0] + 64)) for row in a)
    assert not torch.equal(a, trained_model.windows(ids, 6, 64, seed=2))


def test_the_corpus_split_is_by_file_stable_and_disjoint(tmp_path):
    root = tmp_path / "sources"
    for i in range(60):
        (root / ("part%d" % (i % 3))).mkdir(parents=True, exist_ok=True)
        (root / ("part%d" % (i % 3)) / ("doc%d.rst.txt" % i)).write_text("document %d\n\nline\n\n" % i)
    (root / "skipped.html").write_text("not a source")
    parts = corpus.split(str(root), 0.2)
    assert parts == corpus.split(str(root), 0.2)
    assert not set(parts["train"]) & set(parts["heldout"]) and len(parts["train"]) + len(parts["heldout"]) == 60
    assert 0 < len(parts["heldout"]) < 30
    text = corpus.text(str(root), parts["heldout"])
    assert text.count("document") == len(parts["heldout"]) and text.endswith("line\n")
    with pytest.raises(FileNotFoundError, match="python3.11-doc"):
        corpus.split(str(tmp_path / "empty"), 0.1)
