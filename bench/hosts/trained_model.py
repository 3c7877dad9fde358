"""Issue 40, item 1: quantization judged on a real trained model. In one process on the GPU
machine: a byte-level BPE tokenizer and a LLaMA-architecture model (about 34 M parameters:
hidden 512, 8 layers, intermediate 1408, 8 heads, vocab 8192) trained from a fixed seed on
corpus.py's training text; its held-out perplexity in bf16; then each quantization of it in
a gptqmodel_run.py process of its own (GPTQModel alone; qlink ieee_fp32 and tensor with
GPTQModel's solve, tensor with the triangular inverse; qlink's defaults: tensor, the triangular
inverse and TF32 cross-block updates; those with the vendor's GemmEx Hessians; --variants
picks some), at
4-bit and 3-bit g128, each with two calibration seeds (the noise), and RTN (GPTQModel's
symmetric min-max, no calibration); every quantized model's held-out perplexity from the
solves' quant-dequantized weights written into a bf16 copy. Prints the table, writes JSON.
The quantizations after the first run --parallel at a time (quality is the point here; their
times share the GPU).

    python3 bench/hosts/trained_model.py --corpus CORPUS --dir WORK [--steps 1500]
        [--samples 128] [--seqlen 512] [--bits 4,3] [--variants NAME,...] [--parallel 4]
        [--out RESULT.json]

CORPUS: corpus.py's output (train.txt, heldout.txt). Deterministic: seeded weights and
batches, eager attention, torch's deterministic algorithms."""
import argparse
import concurrent.futures
import json
import math
import os
import subprocess
import sys
import time

from common import HOST_SOLVE

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=8, vocab_size=8192, max_position_embeddings=1024)
VARIANTS = {"GPTQModel alone": [],
            "qlink ieee_fp32": ["--qlink", "--strict", "--precision", "ieee_fp32"] + HOST_SOLVE,
            "qlink tensor": ["--qlink", "--strict", "--precision", "tensor"] + HOST_SOLVE,
            "qlink tensor triangular": ["--qlink", "--strict", "--precision", "tensor", "--tf32", "off"],
            "qlink defaults": ["--qlink", "--strict", "--defaults"],
            "qlink tensor_gemm": ["--qlink", "--strict", "--precision", "tensor_gemm"]}


def train_tokenizer(text_path, vocab):
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train([text_path], trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>", pad_token="</s>")


def token_ids(tokenizer, path):
    import torch
    with open(path, encoding="utf-8") as f:
        return torch.tensor(tokenizer(f.read())["input_ids"], dtype=torch.long)


def windows(ids, count, seqlen, seed):
    """`count` windows of seqlen tokens at seeded random offsets: (count, seqlen)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - seqlen, (count,), generator=gen)
    return torch.stack([ids[s:s + seqlen] for s in starts.tolist()])


def train(args, ids, log):
    """The trained model (fp32 master weights, bf16 autocast), its loss curve and time."""
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.LlamaConfig(tie_word_embeddings=False, **SIZES)
    model = transformers.LlamaForCausalLM(config).cuda()
    model.config._attn_implementation = "eager"  # deterministic backward
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    start, curve = time.perf_counter(), []
    for step in range(args.steps):
        batch = windows(ids, args.batch, args.seqlen, seed=1000 + step).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == args.steps - 1:
            curve.append((step, round(float(loss), 4)))
            log("step %d loss %.4f" % curve[-1])
    torch.cuda.synchronize()
    model.config._attn_implementation = "sdpa"
    return model, curve, round(time.perf_counter() - start, 1)


def perplexity(model, ids, seqlen, batch=16):
    """exp of the mean next-token loss over ids' consecutive windows of seqlen."""
    import torch
    rows = ids[:len(ids) // seqlen * seqlen].view(-1, seqlen)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(rows), batch):
            x = rows[i:i + batch].cuda()
            logits = model(input_ids=x).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                     reduction="sum")
            total, count = total + float(loss), count + x[:, 1:].numel()
    return math.exp(total / count)


def rtn(weight, bits, group=128):
    """Round-to-nearest of weight's groups of `group` columns on GPTQModel's symmetric grid
    (its Quantizer.find_params with sym and no mse search: the range from 0 to each group's
    largest magnitude, a group of zeros given [-1, 1])."""
    import torch
    w = weight.float().reshape(-1, group)
    maxq = 2 ** bits - 1
    xmin, xmax = torch.clamp(w.amin(1), max=0), torch.clamp(w.amax(1), min=0)
    xmax = torch.maximum(xmin.abs(), xmax)
    xmin = torch.where(xmin < 0, -xmax, xmin)
    flat = (xmin == 0) & (xmax == 0)
    xmin, xmax = torch.where(flat, -torch.ones_like(xmin), xmin), torch.where(flat, torch.ones_like(xmax), xmax)
    scale = ((xmax - xmin) / maxq).unsqueeze(1)
    zero = torch.full_like(scale, (maxq + 1) / 2)
    q = torch.clamp(torch.round(w / scale) + zero, 0, maxq)
    return (scale * (q - zero)).reshape(weight.shape).to(weight.dtype)


def linears(model):
    import torch
    return {name: m for name, m in model.model.layers.named_modules(prefix="model.layers")
            if isinstance(m, torch.nn.Linear)}


def with_weights(path, weights):
    """The bf16 model at path with every decoder linear's weight replaced from `weights`."""
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16).cuda()
    mine = linears(model)
    missing = sorted(set(mine) - set(weights))
    if missing:
        raise ValueError("no quantized weight for %d linears, %s first" % (len(missing), missing[0]))
    with torch.no_grad():
        for name, m in mine.items():
            m.weight.copy_(weights[name].to(m.weight.device, m.weight.dtype))
    return model


def quantize(args, model_dir, calibration, bits, variant, seed):
    """One gptqmodel_run.py process: (its JSON result, the dequantized weights' file), or
    ({"error": its last line}, None)."""
    tag = "%s.%d.%d" % (variant.replace(" ", "_"), bits, seed)
    out, weights = os.path.join(args.dir, tag + ".json"), os.path.join(args.dir, tag + ".pt")
    cmd = [sys.executable, os.path.join(HERE, "gptqmodel_run.py"), "--model", model_dir, "--layers",
           str(SIZES["num_hidden_layers"]), "--bits", str(bits), "--calibration", calibration, "--dequantized", weights,
           "--out", out] + VARIANTS[variant]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1][-400:]}, None
    with open(out) as f:
        return json.load(f), weights


def quantizations(args, model_dir, calibrations, log):
    """Every (variant, bits, seed)'s run, the first alone (it builds GPTQModel's C++ packer),
    the rest --parallel at a time (their quantize_s are then shared-GPU times, not speeds)."""
    jobs = [(variant, bits, seed) for bits in args.bits for variant in args.variants for seed in calibrations]

    def one(job):
        variant, bits, seed = job
        outcome = quantize(args, model_dir, calibrations[seed], bits, variant, seed)
        log("quantized %s %d-bit seed %d" % job)
        return outcome

    done = {jobs[0]: one(jobs[0])}
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        done.update(zip(jobs[1:], pool.map(one, jobs[1:])))
    return [(job, done[job]) for job in jobs]


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--corpus", required=True)
    a.add_argument("--dir", required=True)
    a.add_argument("--steps", type=int, default=1500)
    a.add_argument("--batch", type=int, default=32)
    a.add_argument("--lr", type=float, default=1e-3)
    a.add_argument("--samples", type=int, default=128)
    a.add_argument("--seqlen", type=int, default=512)
    a.add_argument("--bits", default="4,3")
    a.add_argument("--variants", default=",".join(VARIANTS), help="of VARIANTS, comma-separated")
    a.add_argument("--parallel", type=int, default=4, help="quantization processes at once (after the first)")
    a.add_argument("--out")
    args = a.parse_args()
    args.bits = [int(b) for b in args.bits.split(",")]
    args.variants = args.variants.split(",")
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        a.error("--variants: unknown %s (of %s)" % (unknown, ", ".join(VARIANTS)))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.makedirs(args.dir, exist_ok=True)

    def log(line):
        print(line, flush=True)

    tokenizer = train_tokenizer(os.path.join(args.corpus, "train.txt"), SIZES["vocab_size"])
    train_ids, heldout_ids = (token_ids(tokenizer, os.path.join(args.corpus, n)) for n in ("train.txt", "heldout.txt"))
    result = {"recipe": dict(SIZES, steps=args.steps, batch=args.batch, seqlen=args.seqlen, lr=args.lr,
                             train_tokens=len(train_ids), heldout_tokens=len(heldout_ids))}
    model, result["loss_curve"], result["train_s"] = train(args, train_ids, log)
    result["parameters"] = sum(p.numel() for p in model.parameters())
    model_dir = os.path.join(args.dir, "model")
    model.to(torch.bfloat16).save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    rows = {"bf16": {"ppl": perplexity(model, heldout_ids, args.seqlen)}}
    log("bf16 held-out perplexity %.3f" % rows["bf16"]["ppl"])
    reference = {name: m.weight.detach().clone() for name, m in linears(model).items()}
    del model
    calibrations = {}
    for seed in (1, 2):
        calibrations[seed] = os.path.join(args.dir, "calibration.%d.pt" % seed)
        torch.save(windows(train_ids, args.samples, args.seqlen, seed=seed), calibrations[seed])
    for bits in args.bits:
        rows["RTN %d-bit" % bits] = {"ppl": perplexity(with_weights(model_dir, {
            name: rtn(w, bits) for name, w in reference.items()}), heldout_ids, args.seqlen)}
    for (variant, bits, seed), (run, weights) in quantizations(args, model_dir, calibrations, log):
        name = "%s %d-bit seed %d" % (variant, bits, seed)
        if weights is None:
            rows[name] = {"error": run["error"]}
            log("%s: %s" % (name, run["error"]))
            continue
        ppl = perplexity(with_weights(model_dir, torch.load(weights)), heldout_ids, args.seqlen)
        rows[name] = {"ppl": ppl, "quantize_s": run["quantize_s"], "digest": run["digest"][:8]}
        log("%s: perplexity %.3f" % (name, ppl))
    result["rows"] = rows
    print("\n| model | held-out perplexity | quantize |\n|---|---|---|")
    for name, row in rows.items():
        shown = row["error"] if "error" in row else "%.3f" % row["ppl"]
        print("| %s | %s | %s |" % (name, shown, "%.1f s" % row["quantize_s"] if "quantize_s" in row else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
