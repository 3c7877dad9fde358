"""AutoRound W4A16 quantizations of the issue's model with AutoRound's own orchestrator,
alone or with qlink installed (torch guards in force then), several times in one process:
the first a warm-up (AutoRound compiles its block forward with torch.compile; qlink
captures its CUDA graphs), the last timed; --profile FILE adds one run under torch.profiler
for the GPU's busy share (its operator table to FILE); --cprofile FILE times the last run
under cProfile instead (its table to FILE). Each run: the wall time of quantize(), the tuning time of
AutoRound's own log line ("quantization tuning time"), each block's loss line, and the
quantized model's output error on held-out sequences (MSE of the last hidden state
against the bf16 model's, fp32), the same after each block (AutoRound prints its block
losses at 6 decimals), and the peak GPU memory PyTorch allocated. Prints and writes JSON;
qlink's plans and counters. --save DIR times the user's whole flow instead,
quantize_and_save(DIR, format="auto_round"): AutoRound then packs and writes each layer in
its block loop (the held-out error is not measured: the layers are packed).

    python3 autoround_run.py --model DIR --iters 200|0 [--qlink auto|N|off [--grouped-moe on|off]] [--strict]
        [--runs 2] [--profile FILE [--profile-stacks] [--idle FILE]] [--cprofile FILE] [--heldout 16]
        [--blas cublas|cublaslt] [--settings ROW[;ROW...]] [--out FILE]

--blas: the BLAS library PyTorch prefers for its GEMMs (torch.backends.cuda.preferred_blas_library).
--settings: qlink's process settings without qlink, a row "gc,switch" or rows "none;gc;switch": the
first row's runs as --runs says, then one timed run per further row in the same process (its
figures in the JSON's "rows"), so the rows share one warm-up.
--idle: in the profiled run, the GPU's idle time from the first block's tuning on charged to
the host threads' stacks (idle.py).
"""
import argparse
import gc
import logging
import re

import idle
from common import (POOL_SETTING, busy_shares, install_guards, kernel_table, make_llama, process_settings,
                    profiler_activities, python_profile, setup_paths, timed, token_batches, write)

setup_paths()


class Lines(logging.Handler):
    """AutoRound's per-block summary lines and its tuning-time line."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        message = record.getMessage()
        if "loss iter" in message or "layers in the block" in message or "quantization tuning time" in message:
            self.lines.append(message)


def final_losses(lines):
    return [float(line.rsplit(":", 1)[1]) for line in lines if "-> iter" in line]


def tuning_time(lines):
    times = [float(m.group(1)) for m in (re.search(r"quantization tuning time ([0-9.eE+-]+)", x) for x in lines) if m]
    return times[-1] if times else None


def block_outputs(model, tokens, batch=4):
    """Each decoder block's output of every held-out sequence, then the last hidden state
    (after the final norm), fp32 on the GPU: read by forward hooks on the blocks."""
    import torch
    blocks = list(model.model.layers)
    kept = [[] for _ in range(len(blocks) + 1)]

    def keep(index):
        return lambda module, inputs, output: kept[index].append(
            (output[0] if isinstance(output, tuple) else output).float())
    handles = [block.register_forward_hook(keep(index)) for index, block in enumerate(blocks)]
    try:
        with torch.no_grad():
            for i in range(0, len(tokens), batch):
                kept[-1].append(model.model(input_ids=tokens[i:i + batch].cuda()).last_hidden_state.float())
    finally:
        for handle in handles:
            handle.remove()
    return [torch.cat(each) for each in kept]


def errors(outputs, reference):
    """(the last hidden state's MSE, each block's output MSE) against the reference's."""
    each = [float(((out - ref) ** 2).mean()) for out, ref in zip(outputs, reference)]
    return each[-1], each[:-1]


TUNING_MARK = "qlink_bench::tuning"


def mark_tuning(sampler):
    """The sampler started and the idle window opened where AutoRound's orchestrator starts
    tuning its blocks (the first _quantize_blocks call; its tuning-time clock starts just before)."""
    from auto_round.compressors.orchestrator import CompressionOrchestrator
    original = CompressionOrchestrator._quantize_blocks

    def _quantize_blocks(self, *args, **kwargs):
        sampler.start()
        idle.mark(TUNING_MARK)
        return original(self, *args, **kwargs)
    CompressionOrchestrator._quantize_blocks = _quantize_blocks


def load(path):
    import torch
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16)


def quantize_once(args, tokenizer, heldout, reference, settings, profile=False, cprofile=None):
    """One AutoRound(...).quantize() of a freshly loaded model, inside the process settings
    named (common.process_settings): its figures."""
    import torch
    from auto_round import AutoRound
    lines = Lines()
    autoround_log = logging.getLogger("autoround")
    autoround_log.addHandler(lines)
    autoround_log.setLevel(min(autoround_log.getEffectiveLevel(), logging.INFO))  # its per-block loss lines
    model = load(args.model)
    batches = list(token_batches(args.samples, args.seqlen).split(8))
    ar = AutoRound(model, scheme="W4A16", tokenizer=tokenizer, dataset=batches, iters=args.iters,
                   nsamples=args.samples, seqlen=args.seqlen, batch_size=8, device_map=0)
    run = {"profiled": profile}
    torch.cuda.reset_peak_memory_stats()
    if profile:
        sampler = idle.Sampler()
        if args.idle:
            mark_tuning(sampler)
        with torch.profiler.profile(**profiler_activities(args.profile_stacks)) as prof:
            with process_settings(settings), timed(run, "quantize_s"):
                ar.quantize()
        if args.idle:
            sampler.stop()
            idle.report(prof, sampler, TUNING_MARK, args.idle)
    else:
        with python_profile(cprofile), process_settings(settings), timed(run, "quantize_s"):
            if args.save:
                ar.quantize_and_save(args.save, format="auto_round")
            else:
                ar.quantize()
    autoround_log.removeHandler(lines)
    run["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
    run["tuning_s"], run["block_lines"] = tuning_time(lines.lines), lines.lines
    run["final_losses"] = final_losses(lines.lines)
    if profile:  # the share of the quantize call's wall time with a kernel (or a copy) running
        run["gpu_busy_kernels"], run["gpu_busy_kernels_or_copies"] = busy_shares(prof, run["quantize_s"])
        kernel_table(prof, args.profile, stacks=args.profile_stacks)
    run["output_mse"], run["block_mse"] = None, None
    if not args.save:
        model.to("cuda")  # quantized in place (fake-quantized weights), left on the CPU by AutoRound
        run["output_mse"], run["block_mse"] = errors(block_outputs(model, heldout), reference)
    del ar, model
    gc.collect()
    torch.cuda.empty_cache()
    return run


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--model", required=True)
    a.add_argument("--iters", type=int, default=200)
    a.add_argument("--qlink", default=None, help="parallel_quantization with qlink installed: auto, N or off")
    a.add_argument("--strict", action="store_true", help="qlink's failures raise instead of running AutoRound's")
    a.add_argument("--grouped-moe", choices=("on", "off"),
                   help="qlink: install(grouped_moe=...), MoE experts as grouped GEMMs (install's default: on)")
    a.add_argument("--runs", type=int, default=2,
                   help="unprofiled runs of the first row of --settings; the first warms up, the last is timed")
    a.add_argument("--profile", help="one more run under torch.profiler; its operator table to this file")
    a.add_argument("--idle", help="with --profile: the idle GPU time in the tuning by the host stacks, to this file")
    a.add_argument("--cprofile", help="the last unprofiled run under cProfile; its table to this file")
    a.add_argument("--profile-stacks", action="store_true", help="--profile with the Python stack behind each operator")
    a.add_argument("--samples", type=int, default=128)
    a.add_argument("--seqlen", type=int, default=2048)
    a.add_argument("--heldout", type=int, default=16)
    a.add_argument("--blas", choices=("cublas", "cublaslt"), help="torch.backends.cuda.preferred_blas_library")
    a.add_argument("--settings", default="",
                   help="qlink's process settings alone (no qlink), comma-separated: gc, switch, segments "
                        "(common.process_settings), around the quantize call; rows of them separated by ';' "
                        "('none': no setting), each row a timed run of its own after the first's (one process)")
    a.add_argument("--save", metavar="DIR", help="quantize_and_save(DIR, format='auto_round') instead of quantize()")
    a.add_argument("--out")
    args = a.parse_args()
    rows = [[name for name in row.split(",") if name and name != "none"] for row in args.settings.split(";")]
    if args.qlink is not None and any(rows):
        a.error("--settings is for runs without qlink (qlink's install holds its own)")
    if any(POOL_SETTING in row for row in rows):
        a.error("--settings: %s is GPTQModel's CPU pool; AutoRound has none" % POOL_SETTING)
    args.settings = rows[0]
    import torch
    import transformers
    make_llama(args.model)
    if args.blas:
        torch.backends.cuda.preferred_blas_library(args.blas)
    result = {"host": "AutoRound", "iters": args.iters, "qlink": args.qlink, "settings": args.settings,
              "saved": args.save,
              "gpus": torch.cuda.device_count(),
              "blas": str(torch.backends.cuda.preferred_blas_library())}
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    heldout = token_batches(args.heldout, args.seqlen, seed=2)  # not among the calibration's (seed 1)
    model = load(args.model).to("cuda")
    reference = block_outputs(model, heldout)  # the bf16 model's
    del model
    torch.cuda.empty_cache()
    if args.qlink is not None:
        install_guards()
        import qlink.integrations.autoround as qlink_autoround
        parallel = args.qlink if args.qlink in ("auto", "off") else int(args.qlink)
        grouped = {} if args.grouped_moe is None else {"grouped_moe": args.grouped_moe == "on"}
        qlink_autoround.install(parallel, strict=args.strict, config={"backend": "cuda", "log_level": "warn"},
                                **grouped)
    figures = ("quantize_s", "tuning_s", "final_losses", "output_mse", "block_mse", "peak_gib")
    runs = result["runs"] = [quantize_once(args, tokenizer, heldout, reference, rows[0],
                                           cprofile=args.cprofile if r == args.runs - 1 else None)
                             for r in range(args.runs)]
    timed_run = runs[args.runs - 1]
    result.update({k: timed_run[k] for k in figures})
    result["warmup_tuning_s"] = runs[0]["tuning_s"]
    if len(rows) > 1:  # the other rows after the first's, each timed once
        result["rows"] = [dict(settings=rows[0], **{k: timed_run[k] for k in figures})]
        for row in rows[1:]:
            runs.append(quantize_once(args, tokenizer, heldout, reference, row))
            result["rows"].append(dict(settings=row, **{k: runs[-1][k] for k in figures}))
            write(result, args.out)

    def qlink_state():
        if args.qlink is not None:
            result["plans"] = [(name, plan.describe()) for name, plan in qlink_autoround.plans()][:4]
            result["counters"] = qlink_autoround.counters()["seams"]
            result["native_losses"] = [(name, losses[::20]) for name, losses in qlink_autoround.losses()][:4]
    qlink_state()
    write(result, args.out)  # the timed figures kept should the profiled run not finish
    if args.profile:
        runs.append(quantize_once(args, tokenizer, heldout, reference, rows[0], profile=True))
        result["gpu_busy_kernels"] = runs[-1]["gpu_busy_kernels"]
        result["gpu_busy_kernels_or_copies"] = runs[-1]["gpu_busy_kernels_or_copies"]
        result["profiled_tuning_s"] = runs[-1]["tuning_s"]
        qlink_state()
        write(result, args.out)


if __name__ == "__main__":
    main()
