"""What the host runs share: the import paths of a packed folder (tools/pack.sh), the torch
guards, the models and the calibration of the issues (LLaMA-7B dimensions, or
Qwen3-30B-A3B's for the MoE one, or small ones of each architecture of arch_table.py; random
weights, random tokens), and a JSON result."""
import contextlib
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def setup_paths():
    """qlink's package, the hosts' package trees and the stand-ins, from a folder laid out
    by tools/pack.sh (python/, hosts/, bench/hosts/standins/)."""
    root = os.environ.get("QLINK_HOSTS_ROOT", os.path.join(HERE, "..", ".."))
    for path in (os.path.join(root, "python"), os.path.join(root, "hosts"), os.path.join(HERE, "standins")):
        sys.path.insert(0, os.path.abspath(path))


class Forbidden(RuntimeError):
    pass


def install_guards():
    """Makes every torch.cuda.comm entry point, torch._C._broadcast_coalesced,
    torch.nn.parallel.replicate and torch.distributed.all_reduce raise: what qlink must not
    depend on (docs/HOSTS.md: they tear copies or hang without the GIL)."""
    import torch
    import torch.cuda.comm
    import torch.nn.parallel

    def forbid(name):
        def raiser(*args, **kwargs):
            raise Forbidden("%s was called while qlink is installed" % name)
        return raiser

    for name in ("broadcast", "broadcast_coalesced", "reduce_add", "reduce_add_coalesced", "scatter", "gather"):
        if hasattr(torch.cuda.comm, name):
            setattr(torch.cuda.comm, name, forbid("torch.cuda.comm." + name))
    torch._C._broadcast_coalesced = forbid("torch._C._broadcast_coalesced")
    torch.nn.parallel.replicate = forbid("torch.nn.parallel.replicate")
    sys.modules["torch.nn.parallel.replicate"].replicate = forbid("torch.nn.parallel.replicate")
    torch.distributed.all_reduce = forbid("torch.distributed.all_reduce")


def host_hessians(installation):
    """GPTQModel's own Hessian arithmetic under an installed qlink (gptqmodel_run.py
    --host-hessians): the task class install() made takes GPTQModel's add_batch and merge
    again, and the expert stage's products are GPTQModel's per batch (host_products), so each
    Hessian is GPTQModel's bits wherever its rows are; the stage's forwards and the solves stay
    qlink's. What is left between such a run and alone is qlink's own."""
    task_class = installation.host.task_class
    del task_class.add_batch, task_class.materialize_global_hessian
    installation.accumulator.add_into = host_products


def host_products(items, device=None):
    """HessianAccumulator.add_into as GPTQModel's add_batch sums (gptq.py compute_hessian_xtx,
    unchunked as its default config leaves it): partial += fp32 X^T X by torch.matmul, for each
    (x, partial) in the order given."""
    import torch
    for x, partial, *_ in items:
        rows = x.reshape(-1, x.shape[-1]).contiguous().to(torch.float32)
        if rows.shape[0]:
            partial.add_(torch.matmul(rows.T, rows))


def host_solves(installation, pattern):
    """GPTQModel's own solve under an installed qlink (gptqmodel_run.py --host-solves) for the
    tasks whose layer name (GPTQModel's full name) matches the regex `pattern`; the others'
    solves stay qlink's. With host_hessians, the layers after the matching ones read what
    they read alone (the matching solves' bytes are GPTQModel's), so the other solves are
    qlink's engine on alone's inputs."""
    from qlink.integrations.gptqmodel.pack_ahead import task_name
    task_class = installation.host.task_class
    own_solve, host_solve = task_class.quantize, task_class.__mro__[1].quantize
    seen = installation.ahead.seen

    def matches(gptq):
        return re.search(pattern, task_name(gptq))

    def quantize(gptq, blocksize=128):
        if matches(gptq):
            return host_solve(installation.merges.own(gptq), blocksize)
        return own_solve(gptq, blocksize)
    task_class.quantize = quantize
    # Nor solved ahead beside their siblings (a solve no one would take).
    installation.ahead.seen = lambda gptq: None if matches(gptq) else seen(gptq)


def make_llama(path, layers=2, hidden=4096, intermediate=11008, heads=32, kv_heads=None, vocab=32000, seed=0):
    """A LLaMA with `layers` decoder layers at 7B dimensions (or those given: LLAMA_70B's)
    and random weights, saved with a word-level tokenizer of `vocab` tokens."""
    import torch
    import transformers
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                                      num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
                                      vocab_size=vocab, max_position_embeddings=4096, torch_dtype="bfloat16")
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    save_tokenizer(path, vocab)
    return path


# gptqmodel_run.py's flags for qlink's engine solving as GPTQModel's own does (its inverse chain, IEEE fp32
# updates; install()'s defaults are the triangular inverse and TF32): the runs held against alone's codes.
HOST_SOLVE = ["--inverse", "cholesky_inverse", "--tf32", "off"]
LLAMA_70B = dict(hidden=8192, intermediate=28672, heads=64, kv_heads=8)  # LLaMA-2/3-70B's layer


def make_qwen3_moe(path, layers=2, vocab=32000, seed=0, hidden=2048, heads=32, kv_heads=4, experts=128,
                   moe_intermediate=768):
    """A Qwen3-MoE with `layers` decoder layers at Qwen3-30B-A3B's dimensions (hidden 2048,
    32 heads and 4 KV heads of 128, 128 experts of 768, top-8, top-k weights renormalised;
    or those given: QWEN3_235B's) and random weights in bfloat16, saved with make_llama's
    tokenizer. The routers are drawn like the other weights, so tokens spread over the
    experts whatever the router's default initialisation is, each layer's router from a
    generator of its own, so a model of more layers starts with the same layers as one of
    fewer (the runs' slope compares like with like)."""
    import transformers
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    config = transformers.Qwen3MoeConfig(hidden_size=hidden, intermediate_size=3 * hidden,
                                         moe_intermediate_size=moe_intermediate, num_hidden_layers=layers,
                                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=128,
                                         num_experts=experts, num_experts_per_tok=8, norm_topk_prob=True,
                                         decoder_sparse_step=1, mlp_only_layers=[], vocab_size=vocab,
                                         max_position_embeddings=4096, torch_dtype="bfloat16")
    return _save_moe(transformers.Qwen3MoeForCausalLM, config, path, vocab, seed)


QWEN3_235B = dict(hidden=4096, heads=64, kv_heads=4, experts=128, moe_intermediate=1536)  # Qwen3-235B-A22B's layer
# Qwen3-30B-A3B's module tree (128 experts of three linears a layer) with small matrices: at its 48 layers, the
# loop's costs per module at a whole model's size, in a checkpoint of 1.2 GB.
QWEN3_MOE_TREE = dict(hidden=256, heads=2, kv_heads=1, experts=128, moe_intermediate=128)


def make_deepseek_v3(path, layers=1, vocab=32000, seed=0):
    """A DeepSeek-V3 with `layers` MoE decoder layers at its dimensions (transformers'
    DeepseekV3Config defaults: hidden 7168, multi-head latent attention with 128 heads, 256
    routed experts of 2048 and one shared, top-8 of 8 groups' best 4, sigmoid scores), no
    dense layers first, random weights in bfloat16 (the routers drawn as make_qwen3_moe's)."""
    import transformers
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    config = transformers.DeepseekV3Config(num_hidden_layers=layers, first_k_dense_replace=0, vocab_size=vocab,
                                           max_position_embeddings=4096, torch_dtype="bfloat16")
    return _save_moe(transformers.DeepseekV3ForCausalLM, config, path, vocab, seed)


def _save_moe(model_class, config, path, vocab, seed):
    """model_class(config) made on the GPU in bfloat16, each layer's router redrawn from a
    generator of its own, saved with make_llama's tokenizer at path."""
    import torch
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = model_class(config).to(torch.bfloat16)
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            gen = torch.Generator(device="cuda").manual_seed(seed * 1000 + i)
            layer.mlp.gate.weight.normal_(0, config.initializer_range, generator=gen)
    model.save_pretrained(path, safe_serialization=True)
    save_tokenizer(path, vocab)
    return path


ARCHS = ("opt", "llama_gqa", "qwen2", "qwen3", "mistral", "gemma2", "mixtral")


def arch_config(kind, layers=2, hidden=1024, intermediate=2816, heads=16, kv_heads=4, vocab=32000):
    """The transformers config of a small model of `kind` (ARCHS: issue 43's item 7): every
    linear's dimensions multiples of 128 (head_dim 64, intermediate 2816), LLaMA's and the
    others' key/value heads fewer than the query's (grouped-query attention; OPT has none),
    Mixtral's 8 experts top-2, bfloat16."""
    import transformers
    head_dim = hidden // heads
    common = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, vocab_size=vocab,
                  max_position_embeddings=4096, torch_dtype="bfloat16")
    rotary = dict(common, intermediate_size=intermediate, num_key_value_heads=kv_heads)
    if kind == "opt":
        return transformers.OPTConfig(ffn_dim=intermediate, word_embed_proj_dim=hidden, do_layer_norm_before=True,
                                      enable_bias=True, **common)
    if kind == "llama_gqa":
        return transformers.LlamaConfig(**rotary)
    if kind == "qwen2":
        return transformers.Qwen2Config(use_sliding_window=False, **rotary)
    if kind == "qwen3":
        return transformers.Qwen3Config(head_dim=head_dim, use_sliding_window=False, **rotary)
    if kind == "mistral":
        return transformers.MistralConfig(head_dim=head_dim, **rotary)
    if kind == "gemma2":
        return transformers.Gemma2Config(head_dim=head_dim, query_pre_attn_scalar=head_dim, **rotary)
    if kind == "mixtral":
        return transformers.MixtralConfig(head_dim=head_dim, num_local_experts=8, num_experts_per_tok=2, **rotary)
    raise ValueError("no architecture %r (one of %s)" % (kind, ", ".join(ARCHS)))


def make_arch(path, kind, layers=2, seed=0, device="cuda", **sizes):
    """A `kind` model (arch_config) with random weights, saved in bfloat16 at path with
    make_llama's tokenizer (kept if path has one already)."""
    import torch
    import transformers
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    torch.manual_seed(seed)
    config = arch_config(kind, layers, **sizes)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    save_tokenizer(path, config.vocab_size)
    return path


def save_tokenizer(path, vocab):
    """A word-level tokenizer of `vocab` tokens (<unk>, <s>, </s>, then t3, t4, ...) at path."""
    import transformers
    from tokenizers import Tokenizer, models
    words = {"<unk>": 0, "<s>": 1, "</s>": 2}
    words.update({"t%d" % i: i for i in range(3, vocab)})
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, "<unk>")),
                                                     unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                                     pad_token="</s>")
    tokenizer.save_pretrained(path)


def token_batches(samples=128, seqlen=2048, vocab=32000, seed=1):
    """samples random-token sequences of seqlen (ids 3.. vocab-1: no special tokens)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (samples, seqlen), generator=gen)


SETTINGS = ("gc", "switch", "segments")
POOL_SETTING = "workers"  # GPTQModel alone: its CPU pool at 2 threads, as install(cpu_workers=2) builds it


def pool_setting(names):
    """GPTQModel's CPU pool at 2 threads where `names` hold "workers" (its own
    GPTQMODEL_CPU_WORKERS, set before it starts the pool: as the run starts)."""
    if POOL_SETTING in names:
        os.environ["GPTQMODEL_CPU_WORKERS"] = "2"


@contextlib.contextmanager
def process_settings(names):
    """qlink's process settings alone, without qlink installed (the baselines' rows): "gc"
    the older objects frozen out of the collector, "switch" a 0.1 ms switch interval,
    "segments" fixed CUDA allocator segments; each as qlink's loops hold them ("workers"
    is pool_setting's, made as the run starts)."""
    from qlink.integrations import process_settings as settings
    known = SETTINGS + (POOL_SETTING,)
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError("unknown process settings %s (known: %s)" % (unknown, ", ".join(known)))
    with contextlib.ExitStack() as stack:
        for name, held in (("gc", settings.frozen_gc), ("switch", lambda: settings.short_switch_interval(1e-4)),
                           ("segments", settings.fixed_segments)):
            if name in names:
                reason = stack.enter_context(held())
                if reason:
                    print("process setting %s not held: %s" % (name, reason), file=sys.stderr)
        yield


@contextlib.contextmanager
def timed(into, key):
    import torch
    torch.cuda.synchronize()
    start = time.perf_counter()
    yield
    torch.cuda.synchronize()
    into[key] = round(time.perf_counter() - start, 3)


def write(result, path):
    text = json.dumps(result, indent=1, sort_keys=True, default=str)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text)


@contextlib.contextmanager
def python_profile(path, rows=70):
    """cProfile over the block when path is given: where the host's Python time goes
    (cumulative and own time, `rows` functions each), written to path as text."""
    if not path:
        yield
        return
    import cProfile
    import io
    import pstats
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        text = io.StringIO()
        for order in ("cumulative", "tottime"):
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(rows)
        with open(path, "w") as f:
            f.write(text.getvalue())


def profiler_activities(stacks=False, device_only=False):
    """torch.profiler's arguments: CPU and CUDA activity, with Python stacks when asked
    (they name the code behind each operator; the run is slower). PyTorch 2 records the
    stacks only with the verbose experimental config: without it the stack table of the
    eleventh session's run came out with no source locations. device_only: the device's
    activity alone, so that the host runs without the profiler's per-operator callbacks
    (a host-bound loop is slowed by them, and its GPU's busy share with it)."""
    import torch
    from torch.profiler import ProfilerActivity
    if device_only:
        return {"activities": [ProfilerActivity.CUDA]}
    args = {"activities": [ProfilerActivity.CPU, ProfilerActivity.CUDA], "with_stack": stacks}
    if stacks:
        args["experimental_config"] = torch._C._profiler._ExperimentalConfig(verbose=True)
    return args


def device_spans(prof, start_us=None):
    """{"kernel": spans, "any": spans}: the profiler's device events as (start, end) µs,
    kernels (not copies, not fills) and every event; with start_us, those ending after it,
    clipped to it."""
    spans = {"kernel": [], "any": []}
    for e in prof.events():
        if getattr(e, "device_type", None) is None or str(e.device_type) != "DeviceType.CUDA":
            continue
        span = (e.time_range.start, e.time_range.end)
        if start_us is not None:
            if span[1] <= start_us:
                continue
            span = (max(span[0], start_us), span[1])
        spans["any"].append(span)
        if not e.name.startswith(("Memcpy", "Memset")):
            spans["kernel"].append(span)
    return spans


def merged_spans(spans):
    """The spans' union as sorted, disjoint [start, end] intervals."""
    merged = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


MARK_KERNEL = "spin_kernel"  # torch.cuda._sleep's kernel: nothing else in these runs launches it


def launch_mark_kernel():
    """Marks the present moment on the device's trace, for a profiler that records no host
    events: the device drained first, so that the mark's kernel starts when the host asks."""
    import torch
    torch.cuda.synchronize()
    torch.cuda._sleep(1)


def loop_start_us(prof, loop_mark):
    """Where the loop starts on the profiler's clock: the host range loop_mark's opening, or
    without host events, the first mark kernel's start (launch_mark_kernel)."""
    opened = [e.time_range.start for e in prof.events() if e.name == loop_mark]
    if not opened:  # the kernel's recorded name is its demangled signature
        opened = [e.time_range.start for e in prof.events() if MARK_KERNEL in e.name]
    return min(opened, default=None)


def busy_shares(prof, wall_s, loop_mark=None):
    """(kernels, kernels or copies): the share of wall_s during which at least one ran,
    from the profiler's device events (their intervals' union); loop_mark: of the time
    from the loop's start (loop_start_us) to the last device event instead."""
    start = loop_start_us(prof, loop_mark) if loop_mark else None
    spans = device_spans(prof, start)
    if loop_mark:
        if start is None or not spans["any"]:
            return None, None
        wall_s = (max(b for _, b in spans["any"]) - start) / 1e6
    return tuple(round(sum(b - a for a, b in merged_spans(spans[k])) / 1e6 / wall_s, 4) for k in ("kernel", "any"))


def kernel_table(prof, path, rows=40, stacks=False):
    """The torch.profiler's operators and kernels by their own device time, then by their
    own host time, written to path as text; with stacks, the operators again by the device
    time of the kernels they launched, each under its 8 innermost Python frames (a kernel
    replayed inside a CUDA graph is the graph's: its eager runs before the capture show)."""
    averages = prof.key_averages()
    with open(path, "w") as f:
        for key in ("self_device_time_total", "self_cpu_time_total"):
            f.write(averages.table(sort_by=key, row_limit=rows, max_name_column_width=90) + "\n")
        if stacks:
            by_stack = prof.key_averages(group_by_stack_n=8)
            f.write(by_stack.table(sort_by="device_time_total", row_limit=rows * 4, max_name_column_width=90) + "\n")


def _stack(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


@contextlib.contextmanager
def stack_samples(path, interval_s=0.002, rows=60):
    """A sampling profile of the calling thread's wall time when path is given: its stack
    read every interval_s by a helper thread (sys._current_frames), so time blocked in C
    (copies, waits, locks) counts as well as Python; each sample weighs the time since the
    one before (a thread running Python holds the GIL the sampler waits for). Written to
    path: the share of the time each function is on the stack (inclusive) and on top
    (innermost Python frame); then the same two tables over every other thread (the host's
    background workers: solves, packing, finalizers), each thread's time counted (a worker
    waiting for work is on top in threading's wait or queue's get)."""
    if not path:
        yield
        return
    import collections
    import threading
    target, stop = threading.get_ident(), threading.Event()
    inclusive, innermost, count = collections.Counter(), collections.Counter(), [0]
    others, others_innermost = collections.Counter(), collections.Counter()

    def where(frame):
        code = frame.f_code
        return "%s:%d(%s)" % (os.path.relpath(code.co_filename, os.getcwd()) if code.co_filename.startswith("/")
                              else code.co_filename, code.co_firstlineno, code.co_name)

    def sample():
        last = time.perf_counter()
        me = threading.get_ident()
        while not stop.wait(interval_s):
            frames = sys._current_frames()
            frame = frames.get(target)
            now = time.perf_counter()
            weight, last = now - last, now
            for ident, other in frames.items():
                if ident not in (target, me):
                    others_innermost[where(other)] += weight
                    for name in {where(f) for f in _stack(other)}:
                        others[name] += weight
            if frame is None:
                continue
            count[0] += 1
            innermost[where(frame)] += weight
            seen = set()
            while frame is not None:
                seen.add(where(frame))
                frame = frame.f_back
            for name in seen:
                inclusive[name] += weight
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        total = max(sum(innermost.values()), 1e-9)
        with open(path, "w") as f:
            for title, table in (("inclusive", inclusive), ("innermost", innermost),
                                 ("other threads, inclusive (thread-seconds)", others),
                                 ("other threads, innermost (thread-seconds)", others_innermost)):
                f.write("%s (%d samples every %.1f ms, %.2f s)\n" % (title, count[0], 1e3 * interval_s, total))
                for name, t in table.most_common(rows):
                    f.write("%6.1f %% %8.3f s  %s\n" % (100.0 * t / total, t, name))
                f.write("\n")
