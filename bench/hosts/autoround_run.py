"""One AutoRound W4G128 quantization of the issue's model with AutoRound's own code, alone
or with qlink installed (torch guards in force then); prints and writes its wall time, each
block's loss line and qlink's plans and counters.

    python3 autoround_run.py --model DIR --iters 200|0 [--qlink auto|N|off] [--out FILE]
"""
import argparse
import logging

from common import install_guards, make_llama, setup_paths, timed, token_batches, write

setup_paths()


class Lines(logging.Handler):
    """AutoRound's per-block summary lines ("... loss iter 0: a -> iter k: b")."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        message = record.getMessage()
        if "loss iter" in message or "layers in the block" in message:
            self.lines.append(message)


def final_losses(lines):
    out = []
    for line in lines:
        if "-> iter" in line:
            out.append(float(line.rsplit(":", 1)[1]))
    return out


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--model", required=True)
    a.add_argument("--iters", type=int, default=200)
    a.add_argument("--qlink", default=None, help="parallel_quantization with qlink installed: auto, N or off")
    a.add_argument("--samples", type=int, default=128)
    a.add_argument("--seqlen", type=int, default=2048)
    a.add_argument("--out")
    args = a.parse_args()
    import torch
    import transformers
    make_llama(args.model)
    result = {"host": "AutoRound", "iters": args.iters, "qlink": args.qlink, "gpus": torch.cuda.device_count()}
    if args.qlink is not None:
        install_guards()
        import qlink.integrations.autoround as qlink_autoround
        parallel = args.qlink if args.qlink in ("auto", "off") else int(args.qlink)
        qlink_autoround.install(parallel, config={"backend": "cuda", "log_level": "warn"}, check_replicas=True)
    from auto_round import AutoRound
    lines = Lines()
    autoround_log = logging.getLogger("autoround")
    autoround_log.addHandler(lines)
    autoround_log.setLevel(min(autoround_log.getEffectiveLevel(), logging.INFO))  # its per-block loss lines
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    batches = list(token_batches(args.samples, args.seqlen).split(8))
    ar = AutoRound(model, scheme="W4A16", tokenizer=tokenizer, dataset=batches, iters=args.iters,
                   nsamples=args.samples, seqlen=args.seqlen, batch_size=8, device_map=0)
    with timed(result, "quantize_s"):
        ar.quantize()
    result["block_lines"], result["final_losses"] = lines.lines, final_losses(lines.lines)
    if args.qlink is not None:
        result["plans"] = [(name, plan.describe()) for name, plan in qlink_autoround.plans()]
        result["counters"] = qlink_autoround.counters()
    write(result, args.out)


if __name__ == "__main__":
    main()
