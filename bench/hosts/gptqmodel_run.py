"""One GPTQModel quantization (4-bit, group 128) of the issue's model with GPTQModel's own
code, alone, with qlink installed by this script (--qlink), or with no qlink line at all
under `qlink run` (--guards: the same torch guards, qlink installed by the launcher as
GPTQModel is first imported: wheel_run.sh); prints and writes its
wall time, per-layer losses, a digest of every layer's solve (Q, scales, zeros, g_idx as
GPTQ.quantize returns them: the packed model's finished layers are offloaded to meta) and
qlink's counters.

    python3 gptqmodel_run.py --model DIR [--qlink [--strict] | --guards] [--out FILE]
"""
import argparse
import hashlib
import sys

from common import install_guards, make_llama, setup_paths, timed, token_batches, write

setup_paths()


def record_solves(GPTQ, into):
    """Wraps GPTQ.quantize (as installed: GPTQModel's own or qlink's) to record each layer's
    result: a sha256 of what the solve returns (Q, scales, zeros, g_idx) and its loss."""
    import torch
    solve = GPTQ.quantize

    def recording(self, *args, **kwargs):
        out = solve(self, *args, **kwargs)
        digest = hashlib.sha256()
        for t in out[:4]:
            digest.update(t.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
        name = getattr(getattr(self, "_named_module", None), "full_name", self.name)  # layer index included
        into[name] = {"digest": digest.hexdigest(), "loss": out[5], "damp": out[6]}
        return out
    GPTQ.quantize = recording


def combined_digest(layers):
    return hashlib.sha256("".join(layers[k]["digest"] for k in sorted(layers)).encode()).hexdigest()


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--model", required=True)
    a.add_argument("--qlink", action="store_true")
    a.add_argument("--strict", action="store_true")
    a.add_argument("--guards", action="store_true", help="the torch guards without installing qlink (qlink run)")
    a.add_argument("--samples", type=int, default=128)
    a.add_argument("--seqlen", type=int, default=2048)
    a.add_argument("--out")
    args = a.parse_args()
    import torch
    make_llama(args.model)
    result = {"host": "GPTQModel", "qlink": args.qlink, "strict": args.strict, "guards": args.qlink or args.guards,
              "gpus": torch.cuda.device_count()}
    if args.qlink or args.guards:
        install_guards()
    if args.qlink:
        import qlink.integrations.gptqmodel as qlink_gptqmodel
        qlink_gptqmodel.install({"backend": "cuda", "log_level": "warn"}, strict=args.strict)
    from gptqmodel import GPTQModel, QuantizeConfig
    from gptqmodel.quantization.gptq import GPTQ
    layers = {}
    record_solves(GPTQ, layers)
    # GPTQModel's defaults otherwise: its group-aware reordering (act_group_aware) is on.
    config = QuantizeConfig(bits=4, group_size=128, desc_act=False)
    result["act_group_aware"] = bool(config.act_group_aware)
    model = GPTQModel.load(args.model, config)
    ids = token_batches(args.samples, args.seqlen)
    calibration = [{"input_ids": row, "attention_mask": torch.ones_like(row)} for row in ids]
    with timed(result, "quantize_s"):
        model.quantize(calibration, batch_size=1)
    result["losses"] = {k: v["loss"] for k, v in layers.items()}
    result["digest"], result["packed_tensors"] = combined_digest(layers), len(layers)
    if args.qlink:
        result["counters"] = qlink_gptqmodel.counters()
    # Which qlink ran (the wheel's or a source tree's), however it was loaded; not an import.
    result["qlink_package"] = getattr(sys.modules.get("qlink"), "__file__", None)
    write(result, args.out)


if __name__ == "__main__":
    main()
