"""One GPTQModel quantization (4-bit, group 128) of the issue's model with GPTQModel's own
code, alone, with qlink installed by this script (--qlink), or with no qlink line at all
under `qlink run` (--guards: the same torch guards, qlink installed by the launcher as
GPTQModel is first imported: wheel_run.sh); prints and writes its
wall time, per-layer losses, a digest of every layer's solve (Q, scales, zeros, g_idx as
GPTQ.quantize returns them: the packed model's finished layers are offloaded to meta),
peak GPU memory (PyTorch's allocator, the first GPU's and each GPU's; qlink's scratch is
outside it) and qlink's counters.
Nothing the script records waits on the device or copies to the host inside the timed
call (device checksums, turned into digests after it).

    python3 gptqmodel_run.py --model DIR [--layers N]
        [--model-kind llama|llama70b|qwen3_moe|qwen3_235b|qwen3_moe_tree|deepseek_v3|ARCH]
        [--qlink [--strict] [--defaults] [--expert-stage on|off] [--inverse cholesky_inverse|triangular]
         [--tf32 on|off] [--attention-outputs on|off] [--tail-inputs on|off] [--stopped-products on|off]
         [--read-ahead pinned|pageable|off]
         [--switch-interval S|off] [--landing pinned|pageable] [--pinned-warmup on|off] [--segments fixed|host]
         | --guards]
        [--precision ieee_fp32|tensor] [--reversed] [--hessian-f64] [--codes FILE.pt]
        [--stop-at-layer N | --stop-at-module REGEX] [--warm-attention] [--merge-each] [--host-hessians]
        [--host-solves REGEX] [--grouped-experts on|off]
        [--input-digests] [--batch-digests REGEX] [--call-digests REGEX] [--no-digests] [--module-offload on|off]
        [--cache-check]
        [--profile OPS.txt [--profile-stacks] [--idle IDLE.txt] | --profile OPS.txt --device-only]
        [--cprofile FILE | --samples-out FILE] [--out FILE]

--layers: decoder layers of the model made at DIR (if DIR has none yet); --model-kind: a
LLaMA-7B-shaped one (default), a LLaMA-70B-shaped one (llama70b), a Qwen3-30B-A3B-, Qwen3-235B-A22B-
or DeepSeek-V3-shaped MoE (its experts split by the defuser stand-in as GPTQModel loads it), Qwen3-30B-A3B's
module tree with small matrices (qwen3_moe_tree: the loop's costs per module), or a small one of an
architecture of common.ARCHS (common.make_arch: opt, llama_gqa, ... mixtral; arch_table.py).
--precision, --inverse, --tf32, --attention-outputs, --tail-inputs, --stopped-products:
install's hessian_precision, inverse, tf32, attention_outputs, tail_inputs and stopped_products
(its defaults where not given; all but --precision go with --defaults, as --expert-stage
does). --input-digests:
digests of each solve's weight and merged Hessian beside its result's (where two runs part,
which input parted first); --no-digests: the solves' losses alone, no digest of the solves
or the packs (their checksums and the packs' copies run beside the loop: a MoE layer's 388
modules make that work visible); --module-offload off: the finalizers' per-module disk offload
(GPTQModel's offload_to_disk of each finished module: a directory, a safetensors file and an
index each) left out, the modules kept in CPU memory: what that offload costs the loop, an
experiment and no setting to ship; --batch-digests: digests of every input add_batch (GPTQModel's or
qlink's) is given for the layers whose name matches REGEX, in order, one per sample of a
(samples, tokens, columns) input, and with --qlink each forward's rows of a matching expert
linear in qlink's expert stage (whether the forwards or the accumulation made two Hessians
differ, and in which sample); --call-digests: digests of every tensor each call of
the modules whose name matches REGEX is given and of the module's parameters then, in call
order (which of a forward's inputs two runs part in first). --codes: every layer's 4-bit levels saved
(torch.save of {layer: uint8 codes}) for compare_codes.py. --profile: torch.profiler over
the quantize call; the share of its wall time with a kernel running (GPU busy), and with a
kernel or a copy; its operator table to OPS.txt (--profile-stacks: with the Python code
behind each operator); --idle: the GPU's idle time over the layer loop charged to the host
threads' stacks and the main thread's operators (idle.py); --device-only: the device's
activity alone recorded (the host free of the profiler's per-operator cost: the busy share
to report). --cprofile, --samples-out: the host's time by function (cProfile; the main
thread's stack sampled every 2 ms). --landing pageable: qlink's finished layers moved by
PyTorch's copy; --pinned-warmup off: layer 0's landing page-locks its own blocks.
--reversed, --hessian-f64: the references arch_table.py --references compares with (the
samples' order GPTQModel's sums follow; its products in float64).
"""
import argparse
import contextlib
import hashlib
import os
import re
import sys
import threading
import time

import idle
from common import (ARCHS, LLAMA_70B, QWEN3_235B, QWEN3_MOE_TREE, busy_shares, host_hessians, host_solves,
                    install_guards, kernel_table, launch_mark_kernel, make_arch, make_deepseek_v3, make_llama,
                    make_qwen3_moe, pool_setting, process_settings, profiler_activities, python_profile, setup_paths,
                    stack_samples, timed, token_batches, write)
from digests import call_digests, device_checksum, gar_order, hessian_traits, record_calls, short_digest

setup_paths()


def levels(q, scale, zero, g_idx, bits=4):
    """The integer levels behind a dequantized weight q = scale * (level - zero), per group
    (on q's device: qlink's batched solves leave scale, zero and g_idx on the CPU)."""
    import torch
    scale, zero, g = scale.to(q.device), zero.to(q.device), g_idx.to(q.device).long()
    return torch.round(q.float() / scale[:, g].float() + zero[:, g].float()).clamp(0, 2 ** bits - 1).to(torch.uint8)


def solve_checksums(out):
    """device_checksum of a solve's Q, and of its scales, zeros and g_idx as one run of bytes."""
    import torch
    small = torch.cat([t.detach().contiguous().view(-1).view(torch.uint8) for t in out[1:4]])
    return [device_checksum(out[0]), device_checksum(small)]


def record_solves(GPTQ, into, codes=None, stop_at_layer=None, inputs=False, batches=None, dequantized=None,
                  on_stop=None, digests=True, first_solves=None, stop_at_module=None):
    """Wraps GPTQ.quantize (as installed: GPTQModel's own or qlink's) to record each layer's
    result: device checksums of what the solve returns (Q, scales, zeros, g_idx) and its
    loss; its levels (on the device) where `codes` is a dict. Nothing waits on the device
    inside the timed run; finish_records() turns the records into digests (and codes on
    the host) after it. stop_at_layer: the process ends at that layer's first solve, once
    its time is printed and on_stop() has reported the layers before (the time a layer
    takes, without the rest of the run). stop_at_module: a regex; the process ends so at the
    first solve of a module it matches (what came before it, without the rest). inputs: also
    checksums of what each solve reads, its weight as the solve starts and its merged Hessian
    (GPTQ.finalize_hessian's, the last before the solve), and what of that Hessian the
    solve's order and damp read (digests.hessian_traits): where two runs' solves differ,
    which input differed first. batches: a regex; checksums of each input add_batch is given
    for the layers it matches, each sample's, into into[name]["batch_sums"] (GPTQ.add_batch as
    installed). Returns the dict those checksums wait in until their layer's solve
    (record_stage_rows adds the expert stage's to it).
    dequantized: a dict that receives each layer's quant-dequantized weight (the solve's Q),
    on its device. digests=False: each solve's loss alone (no checksum work beside the loop's).
    first_solves: a dict that receives each layer's first solve, seconds from the wrap."""
    import torch
    from qlink.integrations.gptqmodel.pack_ahead import task_name  # the layer index included
    solve = GPTQ.quantize
    start, layers_seen, hessians, fed = time.perf_counter(), set(), {}, {}
    stopping = threading.Lock()
    if batches is not None:
        add_batch = GPTQ.add_batch

        def adding(self, inp, *args, **kwargs):
            name = task_name(self)
            if re.search(batches, name) and torch.is_tensor(inp):
                # One per sample: a grouped forward's (samples, tokens, columns) input holds several.
                fed.setdefault(name, []).extend(map(device_checksum, inp.unbind(0) if inp.dim() == 3 else [inp]))
            return add_batch(self, inp, *args, **kwargs)
        GPTQ.add_batch = adding
    if inputs:
        finalize = GPTQ.finalize_hessian

        def finalizing(self, *args, **kwargs):
            out = finalize(self, *args, **kwargs)
            if torch.is_tensor(getattr(self, "H", None)):
                group = self.qcfg.group_size if self.qcfg.group_size > 0 else self.H.shape[0]
                order = gar_order(self.H, group) if self.qcfg.act_group_aware and group < self.H.shape[0] else None
                hessians[task_name(self)] = (device_checksum(self.H), hessian_traits(self.H, group, order))
            return out
        GPTQ.finalize_hessian = finalizing

    def stop():
        with stopping:  # one worker reports; the others wait here for the exit
            if on_stop is not None:
                on_stop(time.perf_counter() - start)
            os._exit(0)

    def recording(self, *args, **kwargs):
        weight = device_checksum(self.module.weight) if inputs else None
        out = solve(self, *args, **kwargs)
        name = task_name(self)
        layer = re.search(r"layers\.(\d+)\.", name)
        if layer and layer.group(1) not in layers_seen:  # in the log as it runs: a slope even from a cut run
            layers_seen.add(layer.group(1))
            seconds = time.perf_counter() - start
            print(f"first solve of layer {layer.group(1)} at {seconds:.1f} s", flush=True)
            if first_solves is not None:
                first_solves[int(layer.group(1))] = round(seconds, 3)
            if stop_at_layer is not None and int(layer.group(1)) >= stop_at_layer:
                stop()
        if stop_at_module is not None and re.search(stop_at_module, name):
            stop()
        into[name] = {"sums": solve_checksums(out) if digests else None, "loss": out[5], "damp": out[6]}
        if inputs:
            hessian, into[name]["traits"] = hessians.pop(name, (None, None))
            into[name]["input_sums"] = {"weight": weight, "hessian": hessian}
        if name in fed:
            into[name]["batch_sums"] = fed.pop(name)
        if codes is not None:
            codes[name] = levels(*out[:4])
        if dequantized is not None:
            dequantized[name] = out[0].detach().clone()
        return out
    GPTQ.quantize = recording
    return fed


def record_stage_rows(model, batches, fed):
    """qlink's expert stage's rows as --batch-digests takes add_batch's: each forward's rows
    of each expert linear of `model` named to match the regex `batches`, one checksum a
    forward the expert has rows in (GPTQModel's add_batch call), into `fed` (record_solves')."""
    from qlink.integrations.gptqmodel import expert_pass
    init = expert_pass.ExpertPass.__init__

    def recording_init(self, weights, record, sink):
        path = next(n for n, m in model.named_modules() if m is weights.experts)
        linears = ("gate_proj", "up_proj") if record == "inputs" else ("down_proj",)

        def digesting(rows, counts):
            at = 0
            for expert, count in enumerate(counts):
                for name in ("%s.%d.%s" % (path, expert, linear) for linear in linears):
                    if count and re.search(batches, name):
                        fed.setdefault(name, []).append(device_checksum(rows[at:at + count]))
                at += count
            return sink(rows, counts)
        init(self, weights, record, digesting)
    expert_pass.ExpertPass.__init__ = recording_init


def warm_attention(config, seqlen):
    """One causal bf16 SDPA on the GPU at the model's head count and size, a sample long:
    the backend's first-call setup done before the loop's first attention."""
    import torch
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    q = torch.randn(1, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.cuda.synchronize()


def _layer_of(name):
    found = re.search(r"layers\.(\d+)\.", name)
    return int(found.group(1)) if found else -1


def products_in_f64(GPTQ):
    """GPTQModel's per-batch X^T X (GPTQ.compute_hessian_xtx) in float64, returned in its
    float32: what it then sums and scales is its own, each product exact to float32's rounding."""
    def xtx(self, matrix):
        wide = matrix.double()
        return (wide.T @ wide).float()
    GPTQ.compute_hessian_xtx = xtx


def finish_records(into, codes=None):
    """The records' checksums as one sha256 per layer, losses as floats, codes on the host."""
    for record in into.values():
        sums, record["digest"] = record.pop("sums"), None
        if sums is not None:
            digest = hashlib.sha256()
            for part in sums:
                digest.update(part.cpu().numpy().tobytes())
            record["digest"] = digest.hexdigest()
        for what, sums in record.pop("input_sums", {}).items():
            record[what + "_digest"] = None if sums is None else hashlib.sha256(
                sums.cpu().numpy().tobytes()).hexdigest()
        if record.get("traits") is not None:
            record["traits"] = {k: int(v) for k, v in record["traits"].items()}
        if "batch_sums" in record:
            record["batch_digests"] = [short_digest(sums) for sums in record.pop("batch_sums")]
        record["loss"], record["damp"] = float(record["loss"]), float(record["damp"])
    if codes is not None:
        for name in codes:
            codes[name] = codes[name].cpu()


LOOP_MARK = "qlink_bench::layer_loop"


def mark_layer_loop():
    """A profiler range opened when GPTQModel's input capture returns (ModuleLooper.
    cache_inputs, qlink's or the host's): where its layer loop starts on the trace."""
    from gptqmodel.looper.module_looper import ModuleLooper
    original = ModuleLooper.cache_inputs

    def cache_inputs(self, *args, **kwargs):
        cache = original(self, *args, **kwargs)
        idle.mark(LOOP_MARK)
        launch_mark_kernel()
        return cache
    ModuleLooper.cache_inputs = cache_inputs


def record_packs(into):
    """A digest of each packed layer's buffers (qweight, qzeros, scales, g_idx) as GPTQModel's
    finalizer leaves them, by name: GPTQModel's packer and qlink's compared where the solves
    are equal. The finished layers go to meta afterwards, so they are read here."""
    import gptqmodel.looper.gptq_processor as processor
    import torch
    original = processor.pack_module

    def recording(*args, **kwargs):
        label = original(*args, **kwargs)
        name = kwargs["name"]
        module = kwargs["qModules"][name]
        digest = hashlib.sha256()
        for buffer in ("qweight", "qzeros", "scales", "g_idx"):
            digest.update(getattr(module, buffer).cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        into[name] = digest.hexdigest()
        return label
    processor.pack_module = recording


def combined_digest(layers):
    if any(layer["digest"] is None for layer in layers.values()):
        return None  # --no-digests
    return hashlib.sha256("".join(layers[k]["digest"] for k in sorted(layers)).encode()).hexdigest()


MOE_SHAPES = {"qwen3_moe": {}, "qwen3_235b": QWEN3_235B, "qwen3_moe_tree": QWEN3_MOE_TREE}  # make_qwen3_moe's


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--model", required=True)
    a.add_argument("--qlink", action="store_true")
    a.add_argument("--strict", action="store_true")
    a.add_argument("--defaults", action="store_true",
                   help="with --qlink: install(config, strict) and nothing else (what a user gets)")
    a.add_argument("--expert-stage", choices=("on", "off"),
                   help="with --qlink: install(expert_stage=...), qlink's owned MoE expert stage (install's default)")
    a.add_argument("--inverse", choices=("cholesky_inverse", "triangular"),
                   help="with --qlink: install(inverse=...), the engine's inverse factor (install's default)")
    a.add_argument("--tf32", choices=("on", "off"),
                   help="with --qlink: install(tf32=...), TF32 cross-block updates (install's default)")
    a.add_argument("--attention-outputs", choices=("on", "off"),
                   help="with --qlink: install(attention_outputs=...), the attention block's outputs kept")
    a.add_argument("--tail-inputs", choices=("on", "off"),
                   help="with --qlink: install(tail_inputs=...), the o_proj and down_proj inputs kept")
    a.add_argument("--stopped-products", choices=("on", "off"),
                   help="with --qlink: install(stopped_products=...), a stopped subset's last product left out")
    a.add_argument("--cpu-workers", type=lambda v: None if v == "host" else int(v), default=False,  # False: not given
                   help="with --qlink: install(cpu_workers=...), GPTQModel's CPU pool's threads ('host': its own "
                        "size, cpu_workers=None, install's default)")
    a.add_argument("--guards", action="store_true", help="the torch guards without installing qlink (qlink run)")
    a.add_argument("--samples", type=int, default=128)
    a.add_argument("--seqlen", type=int, default=2048)
    a.add_argument("--layers", type=int, default=2)
    a.add_argument("--model-kind", choices=("llama", "llama70b", "deepseek_v3") + tuple(MOE_SHAPES) + ARCHS,
                   default="llama")
    a.add_argument("--precision", choices=("ieee_fp32", "tensor", "tensor_gemm"))
    a.add_argument("--stop-at-layer", type=int, help="end the run at this layer's first solve (its time printed)")
    a.add_argument("--stop-at-module", metavar="REGEX", help="end the run at the first solve of a module it matches")
    a.add_argument("--warm-attention", action="store_true",
                   help="one causal SDPA at the model's head shape before the quantize call (its first run of the "
                        "attention is then not the loop's)")
    a.add_argument("--merge-each", action="store_true",
                   help="with --qlink: every task merges its Hessian partials itself (q, k and v three merged "
                        "tensors, the engine's several-Hessian path): a race of concurrent merges, made every time")
    a.add_argument("--host-hessians", action="store_true",
                   help="with --qlink: GPTQModel's own Hessian arithmetic (common.host_hessians: its add_batch and "
                        "merge, and its per-batch products under the expert stage; with --group-rows 0 every "
                        "Hessian GPTQModel's bits): what qlink's forwards, stage and solves change, rounding left out")
    a.add_argument("--host-solves", metavar="REGEX",
                   help="with --qlink: GPTQModel's own solve (common.host_solves) for the layers whose name matches "
                        "REGEX: with --host-hessians, what reaches the other layers' solves is alone's bits")
    a.add_argument("--cache-check", action="store_true",
                   help="with --qlink: at the end, whether the cache qlink placed on the GPU and the grouped "
                        "batches still hold the bytes they were made from (cache_check.py)")
    a.add_argument("--group-rows", type=int, help="qlink: tokens per grouped forward (0: GPTQModel's batches kept)")
    a.add_argument("--grouped-experts", default="on", choices=("on", "off"),
                   help="qlink: off, the routed experts' linears one expert at a time (the host loop's arithmetic, "
                        "bit for bit) where the grouped GEMMs would run")
    a.add_argument("--codes")
    a.add_argument("--bits", type=int, default=4, help="GPTQModel's bits (group size 128)")
    a.add_argument("--calibration", help="a .pt tensor of token ids (samples, seqlen) instead of random tokens")
    a.add_argument("--dequantized", help="each layer's quant-dequantized weight (bf16), as a .pt {name: tensor}")
    a.add_argument("--reversed", action="store_true",
                   help="the calibration samples in reverse order (the same sums in another order: rounding noise)")
    a.add_argument("--hessian-f64", action="store_true",
                   help="alone: GPTQModel's X^T X products in float64 (a reference near the exact Hessian)")
    a.add_argument("--input-digests", action="store_true",
                   help="digests of each solve's weight and merged Hessian (which input two runs differ in) and "
                        "of its output, and what of that Hessian its order, damp and factorization read (ties, mean, "
                        "symmetry), by layer")
    a.add_argument("--no-digests", action="store_true",
                   help="no digest of the solves or the packs (the bench's own work beside the loop left out)")
    a.add_argument("--module-offload", default="on", choices=("on", "off"),
                   help="off: the finalizers' per-module disk offload left out (what it costs the loop)")
    a.add_argument("--batch-digests", metavar="REGEX",
                   help="digests of every add_batch input of the layers whose name matches REGEX, in order, each "
                        "sample's (with --qlink, the expert stage's rows of each matching expert linear too)")
    a.add_argument("--call-digests", metavar="REGEX",
                   help="digests of every tensor each call of the modules matching REGEX is given, and of their "
                        "parameters then, in order")
    a.add_argument("--profile", help="torch.profiler over the quantize call; its operator table to this file")
    a.add_argument("--cprofile", help="cProfile over the quantize call; its table to this file")
    a.add_argument("--read-ahead", default="pinned", choices=("pinned", "pageable", "off"),
                   help="with --qlink: the layer read-ahead's buffers (install's read_ahead)")
    a.add_argument("--segments", default="fixed", choices=("fixed", "host"),
                   help="qlink: the layer loop's CUDA allocator segments fixed (install's default) or as the host set")
    a.add_argument("--landing", default="pinned", choices=("pinned", "pageable"),
                   help="qlink: finished layers land in page-locked memory (its default) or by PyTorch's copy")
    a.add_argument("--pinned-warmup", default="on", choices=("on", "off"),
                   help="qlink: layer 0's landing page-locked during the capture (its default) or at the landing")
    a.add_argument("--switch-interval", default="off",
                   help="with --qlink: the loop's interpreter switch interval in seconds, or off (install's)")
    a.add_argument("--idle", help="with --profile: the GPU's idle time in the loop by the host's stacks, to this file")
    a.add_argument("--device-only", action="store_true",
                   help="--profile recording the device's activity alone (no host operators: the loop's host "
                        "runs at its own speed); the busy shares from the loop's mark kernel")
    a.add_argument("--profile-stacks", action="store_true", help="--profile with the Python stack behind each operator")
    a.add_argument("--samples-out", help="the main thread's stack sampled every 2 ms; its table to this file")
    a.add_argument("--settings", default="", help="qlink's process settings alone, comma-separated: gc, switch, "
                   "segments (common.process_settings), around the quantize call; workers, GPTQModel's CPU pool "
                   "at 2 threads (common.pool_setting)")
    a.add_argument("--out")
    args = a.parse_args()
    if args.device_only and (args.idle or args.profile_stacks or not args.profile):
        a.error("--device-only goes with --profile, without --idle and --profile-stacks (they need host events)")
    args.settings = [name for name in args.settings.split(",") if name]
    if args.settings and args.qlink:
        a.error("--settings is for runs without qlink (qlink's install holds its own)")
    pool_setting(args.settings)
    if args.defaults and (args.precision or args.switch_interval != "off" or args.read_ahead != "pinned"
                          or args.segments != "fixed"):
        a.error("--defaults takes none of --precision, --switch-interval, --read-ahead, --segments")
    if args.no_digests and (args.input_digests or args.batch_digests or args.call_digests):
        a.error("--no-digests leaves out the checksums --input-digests, --batch-digests and --call-digests need")
    if args.hessian_f64 and args.qlink:
        a.error("--hessian-f64 is for GPTQModel alone (qlink's Hessians are its own)")
    import torch
    if args.model_kind in ARCHS:
        make_arch(args.model, args.model_kind, layers=args.layers)
    elif args.model_kind in MOE_SHAPES:
        make_qwen3_moe(args.model, layers=args.layers, **MOE_SHAPES[args.model_kind])
    elif args.model_kind == "deepseek_v3":
        make_deepseek_v3(args.model, layers=args.layers)
    else:
        make_llama(args.model, layers=args.layers, **(LLAMA_70B if args.model_kind == "llama70b" else {}))
    result = {"host": "GPTQModel", "model_kind": args.model_kind, "qlink": args.qlink, "group_rows": args.group_rows,
              "read_ahead": args.read_ahead if args.qlink else None,
              "switch_interval": args.switch_interval if args.qlink and not args.defaults else None,
              "defaults": args.defaults, "expert_stage": args.expert_stage, "inverse": args.inverse,
              "tf32": args.tf32, "attention_outputs": args.attention_outputs,
              "stopped_products": args.stopped_products, "tail_inputs": args.tail_inputs,
              "landing": args.landing if args.qlink else None,
              "pinned_warmup": args.pinned_warmup if args.qlink else None,
              "segments": args.segments if args.qlink else None, "torch_threads": torch.get_num_threads(),
              "strict": args.strict, "guards": args.qlink or args.guards,
              "gpus": torch.cuda.device_count(), "layers": args.layers, "precision": args.precision,
              "profiled": bool(args.profile or args.cprofile or args.samples_out), "settings": args.settings,
              "bits": args.bits, "calibration": args.calibration, "reversed": args.reversed,
              "hessian_f64": args.hessian_f64, "digests": not args.no_digests,
              "module_offload": args.module_offload,
              # GPTQModel's CPU pool (finalizers): its own setting, else install's (qlink), else its default (None)
              "cpu_workers": os.environ.get("GPTQMODEL_CPU_WORKERS") or (
                  (None if args.cpu_workers is False else args.cpu_workers) if args.qlink else None)}
    if args.qlink or args.guards:
        install_guards()
    cache_check = None
    if args.qlink:
        import qlink.integrations.gptqmodel as qlink_gptqmodel
        config = {"backend": "cuda", "log_level": "warn"}
        stage = {} if args.expert_stage is None else {"expert_stage": args.expert_stage == "on"}
        if args.inverse:
            stage["inverse"] = args.inverse
        if args.tf32:
            stage["tf32"] = args.tf32 == "on"
        for name in ("attention_outputs", "tail_inputs", "stopped_products"):
            if getattr(args, name):
                stage[name] = getattr(args, name) == "on"
        if args.cpu_workers is not False:
            stage["cpu_workers"] = args.cpu_workers
        if args.defaults:
            qlink_gptqmodel.install(config, strict=args.strict, **stage)
        else:
            interval = None if args.switch_interval == "off" else float(args.switch_interval)
            qlink_gptqmodel.install(config, strict=args.strict, read_ahead=args.read_ahead, switch_interval=interval,
                                    fixed_segments=args.segments == "fixed", **stage,
                                    **({"hessian_precision": args.precision} if args.precision else {}))
        import qlink.moves as qlink_moves
        if args.landing == "pageable":
            qlink_moves.PINNED_MIN_BYTES = float("inf")
        if args.pinned_warmup == "off":
            qlink_moves.WARMUP_MAX_BYTES = 0
        if args.merge_each:
            merges = qlink_gptqmodel._integration.current.merges
            merges.making = lambda *key: contextlib.nullcontext()
            merges.find = lambda *key: None
        if args.host_hessians:
            host_hessians(qlink_gptqmodel._integration.current)
        if args.host_solves:
            host_solves(qlink_gptqmodel._integration.current, args.host_solves)
        import qlink.integrations.gptqmodel.input_cache as qlink_cache
        if args.group_rows is not None:
            qlink_cache.GROUP_ROWS = args.group_rows
        if args.grouped_experts == "off":
            import qlink.integrations.grouped_experts as qlink_grouped
            qlink_grouped.GROUPED_MM = False
        if args.cache_check:
            from cache_check import CacheCheck
            cache_check = CacheCheck(qlink_cache)
    from gptqmodel import GPTQModel, QuantizeConfig
    from gptqmodel.looper import gptq_processor
    if args.module_offload == "off":
        from gptqmodel.looper import stage_layer
        stage_layer.offload_to_disk = lambda **kwargs: None  # the finalizers' call, by the name it imports
    GPTQ = gptq_processor.GPTQ  # the class the processor builds its tasks from (qlink's where installed)
    if args.hessian_f64:
        products_in_f64(GPTQ)
    layers, codes = {}, {} if args.codes else None
    calls = {}  # --call-digests' records
    dequantized = {} if args.dequantized else None

    def finish(kept=lambda records: records):
        """The run's result written: the records kept() keeps of layers, codes and dequantized."""
        if calls:
            result["call_digests"] = call_digests(calls)
        if cache_check is not None:
            result["cache_check"] = cache_check.report()
        report(args, result, kept(layers), kept(codes), kept(dequantized), packs)

    def stopped(seconds):  # the layers solved before the stop (other workers go on), as a finished run's
        result["stopped_at_s"] = round(seconds, 3)
        last = args.stop_at_layer if args.stop_at_layer is not None else float("inf")

        def before(records):
            if records is not None:
                return {k: v for k, v in list(records.items()) if _layer_of(k) < last}
        finish(before)
    fed = record_solves(GPTQ, layers, codes, args.stop_at_layer, inputs=args.input_digests,
                        batches=args.batch_digests, dequantized=dequantized, on_stop=stopped,
                        digests=not args.no_digests, first_solves=result.setdefault("first_solve_s", {}),
                        stop_at_module=args.stop_at_module)
    packs = {}
    if not args.no_digests:
        record_packs(packs)
    if args.profile:
        mark_layer_loop()
    # GPTQModel's defaults otherwise: its group-aware reordering (act_group_aware) is on.
    config = QuantizeConfig(bits=args.bits, group_size=128, desc_act=False)
    result["act_group_aware"] = bool(config.act_group_aware)
    result["alloc_conf"] = os.environ.get("PYTORCH_ALLOC_CONF")  # GPTQModel sets it on import where unset
    # What the allocator does: one started before the variable was set (this process made the model first) makes
    # fixed segments whatever the variable says.
    from qlink.integrations.process_settings import expandable_now
    result["allocator_expandable"] = expandable_now()
    model = GPTQModel.load(args.model, config)
    if args.call_digests:
        record_calls(model.model, args.call_digests, calls)
    if args.batch_digests and args.qlink:
        record_stage_rows(model.model, args.batch_digests, fed)
    ids = torch.load(args.calibration) if args.calibration else token_batches(args.samples, args.seqlen)
    calibration = [{"input_ids": row, "attention_mask": torch.ones_like(row)} for row in ids]
    if args.reversed:
        calibration.reverse()
    if args.warm_attention:
        warm_attention(model.model.config, args.seqlen)
    for device in range(torch.cuda.device_count()):
        torch.cuda.reset_peak_memory_stats(device)
    if args.profile:
        from torch.profiler import profile
        sampler = idle.Sampler()
        if args.idle:
            sampler.start()
        with profile(**profiler_activities(args.profile_stacks, device_only=args.device_only)) as prof:
            with process_settings(args.settings), timed(result, "quantize_s"):
                model.quantize(calibration, batch_size=1)
        if args.idle:
            sampler.stop()
            idle.report(prof, sampler, LOOP_MARK, args.idle)
        result["gpu_busy_kernels"], result["gpu_busy_kernels_or_copies"] = busy_shares(prof, result["quantize_s"])
        result["gpu_busy_loop_kernels"], result["gpu_busy_loop_kernels_or_copies"] = busy_shares(
            prof, result["quantize_s"], loop_mark=LOOP_MARK)
        kernel_table(prof, args.profile, stacks=args.profile_stacks)
    else:
        with python_profile(args.cprofile), stack_samples(args.samples_out), process_settings(args.settings), \
                timed(result, "quantize_s"):
            model.quantize(calibration, batch_size=1)
    finish()


def report(args, result, layers, codes, dequantized, packs):
    """The run's figures: its records finished, qlink's counters, codes and weights saved, the JSON written."""
    import torch
    result["peak_torch_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
    result["peak_torch_gib_by_gpu"] = [round(torch.cuda.max_memory_allocated(d) / 2 ** 30, 2)
                                       for d in range(torch.cuda.device_count())]
    finish_records(layers, codes)
    result["losses"] = {k: v["loss"] for k, v in layers.items()}
    result["damps"] = {k: v["damp"] for k, v in layers.items()}
    result["digest"], result["packed_tensors"] = combined_digest(layers), len(layers)
    result["pack_digests"] = packs
    if args.input_digests:
        result["input_digests"] = {k: {what: v[what + "_digest"] for what in ("weight", "hessian")}
                                   for k, v in layers.items()}
        result["hessian_traits"] = {k: v.get("traits") for k, v in layers.items()}
        result["solve_digests"] = {k: v["digest"] for k, v in layers.items()}
    if args.batch_digests:
        result["batch_digests"] = {k: v["batch_digests"] for k, v in layers.items() if "batch_digests" in v}
    if args.qlink:
        import qlink.integrations.gptqmodel as qlink_gptqmodel
        result["counters"] = qlink_gptqmodel.counters()["seams"]
        result["hessian_counters"] = qlink_gptqmodel.counters()["hessians"]
        result["staging_counters"] = qlink_gptqmodel.counters()["staging"]
        result["solve_counters"] = qlink_gptqmodel.counters()["solves"]
        result["expert_counters"] = qlink_gptqmodel.counters()["experts"]
        result["pack_counters"] = qlink_gptqmodel.counters()["packs"]
    # Which qlink ran (the wheel's or a source tree's), however it was loaded; not an import.
    result["qlink_package"] = getattr(sys.modules.get("qlink"), "__file__", None)
    if codes is not None:
        torch.save(codes, args.codes)
    if dequantized is not None:
        torch.save({name: q.to("cpu", torch.bfloat16) for name, q in dequantized.items()}, args.dequantized)
    write(result, args.out)


if __name__ == "__main__":
    main()
