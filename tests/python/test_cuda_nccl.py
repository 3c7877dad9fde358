"""Two processes, one GPU each, all-reduce through qlink's NCCL transport and agree with
qlink's in-process collectives; skipped where PyTorch sees fewer than two GPUs."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import qlink

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")

RANK = textwrap.dedent("""
    import os, sys, time, torch
    sys.path.insert(0, sys.argv[1])
    import qlink
    library, rank, id_file, out = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    ctx = qlink.load({"backend": "cuda", "log_level": "warn", "nccl_library": qlink.torch_nccl_library()},
                     library=library)
    if rank == 0:
        with open(id_file + ".tmp", "wb") as f:
            f.write(qlink.unique_id(ctx))
        os.rename(id_file + ".tmp", id_file)
    while not os.path.exists(id_file):
        time.sleep(0.01)
    comm = qlink.Communicator(ctx, open(id_file, "rb").read(), 2, rank, rank)
    results = {}
    for op in ("sum", "avg", "sign"):
        x = torch.randn(3 << 20, generator=torch.Generator().manual_seed(10 + rank)).to(rank) + 0.1
        comm.all_reduce(x, op=op)
        results[op] = x.cpu()
    b = torch.arange(1000, dtype=torch.int32, device=rank) * (rank + 1)
    comm.broadcast(b, root=1)
    results["broadcast"] = b.cpu()
    r = torch.randn(1 << 20, generator=torch.Generator().manual_seed(20 + rank)).to(rank)
    comm.reduce(r, root=0, scale=0.5)
    results["reduce"] = r.cpu()
    torch.cuda.synchronize(rank)
    comm.close()
    torch.save(results, out)
""")


def test_two_processes_agree_with_the_in_process_collectives(library, tmp_path):
    package = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    id_file = str(tmp_path / "uid")
    procs = [subprocess.Popen([sys.executable, "-c", RANK, package, library, str(r), id_file,
                               str(tmp_path / ("rank%d.pt" % r))], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(2)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    got = [torch.load(str(tmp_path / ("rank%d.pt" % r))) for r in range(2)]

    qlink.configure({"backend": "cuda", "log_level": "warn"}, library=library).enable_peer_access()
    for op in ("sum", "avg", "sign"):
        local = [(torch.randn(3 << 20, generator=torch.Generator().manual_seed(10 + r)) + 0.1).to(r) for r in range(2)]
        qlink.all_reduce(local, op=op)
        expected = local[0].cpu()
        assert torch.equal(got[0][op], got[1][op]), op
        if op == "avg":  # NCCL scales before or after summing: same value to the last bits
            assert torch.allclose(got[0][op], expected, atol=1e-6, rtol=1e-6)
        else:
            assert torch.equal(got[0][op], expected), op
    assert torch.equal(got[0]["broadcast"], torch.arange(1000, dtype=torch.int32) * 2)
    parts = [torch.randn(1 << 20, generator=torch.Generator().manual_seed(20 + r)) for r in range(2)]
    assert torch.equal(got[0]["reduce"], (parts[0] + parts[1]) * 0.5)
