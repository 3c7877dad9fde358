"""bench/hosts/gar_ties.py, which asks whether GPTQModel's group-aware order on a GPU breaks
ties in the diagonal as the stable sort (and qlink's engine) does: the count of rows whose
order differs is 0 for the stable order and every tied row for one that breaks ties the
other way."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "hosts"))
import gar_ties  # noqa: E402 (bench/hosts)


def stable(diag, group):
    return torch.sort(diag.view(-1, group), dim=1, descending=True, stable=True).indices


def later_first(diag, group):
    """Descending, equal values in reverse column order."""
    flipped = diag.view(-1, group).flip(1)
    return group - 1 - torch.sort(flipped, dim=1, descending=True, stable=True).indices


def test_every_row_has_one_tie_and_only_an_order_breaking_it_otherwise_differs():
    values = gar_ties.tied_rows(64, 16, True, torch.Generator().manual_seed(0))
    assert all(len(set(row.tolist())) == 15 for row in values)
    assert gar_ties.differing_rows(stable, values, "cpu") == 0
    assert gar_ties.differing_rows(later_first, values, "cpu") == 64


def test_rows_of_few_levels_tie_everywhere():
    values = gar_ties.tied_rows(8, 16, False, torch.Generator().manual_seed(1))
    assert gar_ties.differing_rows(stable, values, "cpu") == 0
    assert gar_ties.differing_rows(later_first, values, "cpu") == 8
