"""8 Python threads x 24 tasks of module moves, nested calibration staging and replica
clones through qlink at once, each checked byte for byte, with the torch guards in force
(docs/HOSTS.md, seed 000's harness). Between GPUs where there are two or more; with one GPU the
moves go host <-> GPU and the clones stay on the GPU (qlink's same-device copy).

    python3 stress_moves.py [--threads 8] [--tasks 24]     exit status 0: every task exact
"""
import argparse
import threading

from common import install_guards, setup_paths

setup_paths()


def same_bytes(a, b):
    import torch
    a, b = a.detach().contiguous(), b.detach().contiguous()
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.cpu().view(-1).view(torch.uint8), b.cpu().view(-1).view(torch.uint8))


def task(ctx, gpus, seed):
    import torch
    gen = torch.Generator().manual_seed(seed)
    home, other = "cuda:%d" % (seed % gpus), "cuda:%d" % ((seed + 1) % gpus) if gpus > 1 else "cpu"
    module = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.LayerNorm(128), torch.nn.Linear(128, 64))
    module.to(dtype=[torch.float32, torch.bfloat16, torch.float16][seed % 3])
    reference = {k: v.clone() for k, v in module.state_dict().items()}
    ctx.move_module_to_device(module, home)
    ctx.move_module_to_device(module, other)
    ctx.move_module_to_device(module, home)
    ok = all(same_bytes(reference[k], v) for k, v in module.state_dict().items())
    batch = {"input_ids": torch.randint(0, 32000, (4, 2048), generator=gen),  # 32 KiB+ first leaf
             "attention_mask": [torch.ones(4, 2048, dtype=torch.bool)],
             "position": (torch.arange(2048), None, "text"), "scale": torch.randn(1, generator=gen).half()}
    staged = ctx.move_nested_to_device(batch, home)
    ok &= same_bytes(staged["input_ids"], batch["input_ids"]) and staged["position"][2] == "text"
    ok &= same_bytes(staged["attention_mask"][0], batch["attention_mask"][0]) and staged["position"][1] is None
    ok &= same_bytes(staged["position"][0], batch["position"][0]) and same_bytes(staged["scale"], batch["scale"])
    clones = ctx.clone_module_for_devices(module, ["cuda:%d" % d for d in range(gpus)])
    for replica in clones.values():
        ok &= all(same_bytes(reference[k], v) for k, v in replica.state_dict().items())
    return ok


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--threads", type=int, default=8)
    a.add_argument("--tasks", type=int, default=24)
    args = a.parse_args()
    install_guards()
    import torch
    import qlink
    ctx = qlink.configure({"backend": "cuda", "log_level": "warn"})
    gpus = torch.cuda.device_count()
    ctx.enable_for_devices(["cuda:%d" % d for d in range(gpus)])
    results, errors = [], []

    def worker(t):
        for k in range(args.tasks):
            try:
                results.append(task(ctx, gpus, t * 1000 + k))
            except Exception as error:  # counted below, the first printed
                errors.append("thread %d task %d: %s: %s" % (t, k, type(error).__name__, error))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    exact = sum(bool(r) for r in results)
    print("%d GPU(s), %d threads x %d tasks: %d byte-exact, %d wrong, %d errors%s" % (
        gpus, args.threads, args.tasks, exact, len(results) - exact, len(errors), (": " + errors[0]) if errors else ""))
    raise SystemExit(0 if exact == args.threads * args.tasks else 1)


if __name__ == "__main__":
    main()
