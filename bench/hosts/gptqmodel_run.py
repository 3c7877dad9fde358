"""One GPTQModel quantization (4-bit, group 128) of the issue's model with GPTQModel's own
code, alone or with qlink installed (torch guards in force then); prints and writes its
wall time, per-module losses, a digest of the quantized tensors and qlink's counters.

    python3 gptqmodel_run.py --model DIR [--qlink] [--strict] [--out FILE]
"""
import argparse
import hashlib

from common import install_guards, make_llama, setup_paths, timed, token_batches, write

setup_paths()


def quantized_digest(model):
    """sha256 over every packed tensor (qweight, qzeros, scales, g_idx) in name order."""
    digest, count = hashlib.sha256(), 0
    for name, t in sorted(model.state_dict().items()):
        if name.rsplit(".", 1)[-1] in ("qweight", "qzeros", "scales", "g_idx"):
            digest.update(name.encode())
            digest.update(t.detach().contiguous().cpu().view(-1).view(__import__("torch").uint8).numpy().tobytes())
            count += 1
    return digest.hexdigest(), count


def module_losses(log):
    losses = {}
    for row in (log or {}).values() if isinstance(log, dict) else []:
        for stat in row if isinstance(row, list) else []:
            if isinstance(stat, dict) and "loss" in stat:
                try:
                    loss = float(stat["loss"])
                except ValueError:
                    loss = stat["loss"]  # a fallback's description
                losses["%s.%s" % (stat.get("layer"), stat.get("module"))] = loss
    return losses


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--model", required=True)
    a.add_argument("--qlink", action="store_true")
    a.add_argument("--strict", action="store_true")
    a.add_argument("--samples", type=int, default=128)
    a.add_argument("--seqlen", type=int, default=2048)
    a.add_argument("--out")
    args = a.parse_args()
    import torch
    make_llama(args.model)
    result = {"host": "GPTQModel", "qlink": args.qlink, "strict": args.strict, "gpus": torch.cuda.device_count()}
    if args.qlink:
        install_guards()
        import qlink.integrations.gptqmodel as qlink_gptqmodel
        qlink_gptqmodel.install({"backend": "cuda", "log_level": "warn"}, strict=args.strict)
    from gptqmodel import GPTQModel, QuantizeConfig
    config = QuantizeConfig(bits=4, group_size=128, desc_act=False, act_group_aware=False)
    model = GPTQModel.load(args.model, config)
    ids = token_batches(args.samples, args.seqlen)
    calibration = [{"input_ids": row, "attention_mask": torch.ones_like(row)} for row in ids]
    with timed(result, "quantize_s"):
        log = model.quantize(calibration, batch_size=1)
    result["losses"] = module_losses(log)
    result["log"] = log
    result["digest"], result["packed_tensors"] = quantized_digest(model.model)
    if args.qlink:
        result["counters"] = qlink_gptqmodel.counters()
    write(result, args.out)


if __name__ == "__main__":
    main()
