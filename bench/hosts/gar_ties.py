"""Whether GPTQModel's group-aware order (gar.py compute_local_perms: torch.topk, sorted, on a
GPU for groups of up to 192 columns) keeps equal diagonal entries in column order, as
torch.sort(stable=True) and qlink's engine (quant/gptq/hessian_inverse.cc) do. Rows of one
group each: some with one tied pair (what a Hessian's diagonal rarely holds), some drawn
from few values (many ties), in diagonals of several group counts (topk may take another
kernel for few rows: a 768- or 2048-column Hessian has 6 or 16 groups of 128); prints and
writes how many rows order their ties otherwise.

    python3 bench/hosts/gar_ties.py [--device cuda] [--rows N ...] [--out FILE.json]
"""
import argparse
import json


def tied_rows(rows, group, pairs_only, generator):
    """(rows, group) float32 values on the CPU: each row one tied pair in random columns
    (pairs_only), else values drawn from 8 levels."""
    import torch
    if not pairs_only:
        return torch.randint(0, 8, (rows, group), generator=generator).float()
    values = torch.rand(rows, group, generator=generator)
    columns = torch.stack([torch.randperm(group, generator=generator)[:2] for _ in range(rows)])
    values[torch.arange(rows), columns[:, 1]] = values[torch.arange(rows), columns[:, 0]]
    return values


def differing_rows(local_perms, values, device):
    """How many rows' order from local_perms(diag, group) (the group's columns, largest
    first) differs from the stable descending order."""
    import torch
    group = values.shape[1]
    got = local_perms(values.reshape(-1).to(device), group).cpu()
    stable = torch.sort(values, dim=1, descending=True, stable=True).indices
    return int((got != stable).any(dim=1).sum())


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--device", default="cuda")
    a.add_argument("--rows", type=int, nargs="+", default=[6, 16, 4096],
                   help="groups in a diagonal, each count in turn")
    a.add_argument("--group", type=int, default=128)
    a.add_argument("--out")
    args = a.parse_args()
    import torch
    from common import setup_paths
    setup_paths()
    from gptqmodel.quantization.gar import compute_local_perms
    generator = torch.Generator().manual_seed(0)
    result = {"torch": torch.__version__, "device": args.device, "group": args.group, "by_rows": {}}
    for rows in args.rows:
        # Diagonals of `rows` groups, 4096 groups drawn in all, each checked on its own.
        found = result["by_rows"][rows] = {}
        for kind, pairs_only in (("one_tied_pair", True), ("eight_levels", False)):
            values = tied_rows(max(rows, 4096) // rows * rows, args.group, pairs_only, generator)
            found[kind] = sum(differing_rows(compute_local_perms, part, args.device) for part in values.split(rows))
            print("%d groups a diagonal, %s: %d of %d groups order their ties otherwise than the stable sort"
                  % (rows, kind, found[kind], len(values)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
