"""bench/solve_bits.py's tied Hessian: one more equal pair on the diagonal, both in one
group of consecutive columns (GPTQModel's group-aware groups), the matrix still positive
definite (GPTQ's Cholesky takes it)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import solve_bits  # noqa: E402 (bench)
from gptq_bench import hessian_of  # noqa: E402 (bench)


def test_a_tie_lands_in_one_group_and_keeps_the_hessian_positive_definite():
    gen = torch.Generator().manual_seed(0)
    h = hessian_of(512, gen, 1024, device="cpu")
    out, (i, j) = solve_bits.tied(h, gen)
    assert i != j and i // solve_bits.GROUP == j // solve_bits.GROUP
    assert out[i, i] == out[j, j] == max(h[i, i], h[j, j])
    changed = (out != h).nonzero().tolist()
    assert changed in ([[i, i]], [[j, j]])  # only the smaller entry was raised
    torch.linalg.cholesky(out)
