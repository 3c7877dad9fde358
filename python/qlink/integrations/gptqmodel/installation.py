"""One installation of qlink in GPTQModel: the host names it resolved (_Host), the state
its seams share (the Hessian accumulator and queue, the solve-ahead, the layer prefetch,
the packs made ahead, the grouped batches' sample length, the expert stage's counts, the
finalizes' lookups, the modules' names indexed) and the installation's settings."""
import contextlib
import importlib

import torch

from ... import _abi
from ...quant.gptq import inverse_code
from ...quant.hessian import HessianAccumulator
from ..base import Installation
from ..process_settings import check_interval
from .attention_outputs import AttentionOutputs
from .contract import replaces_weights
from .expert_stage import ExpertCounts
from .finalize_lookups import FinalizeLookups
from .qualified_names import QualifiedNames
from .gptq import SharedMerges
from .hessian_queue import Queue
from .pack_ahead import PackAhead
from .solve_ahead import SolveAhead
from .structure import LayerPrefetch

READ_AHEAD = ("pinned", "pageable", "off")
# The engine's precisions by name, None for the context config's.
HESSIAN_PRECISIONS = tuple(name for name in _abi.HESSIAN_PRECISIONS if name != "default") + (None,)


class _Host:
    """The GPTQModel objects the seams call besides the ones they replace."""

    def __init__(self, names):
        self.helpers = importlib.import_module("gptqmodel.utils.looper_helpers")
        self.GPTQ = names["gptqmodel.quantization.gptq:GPTQ"]
        self.Quantizer = names["gptqmodel.quantization.quantizer:Quantizer"]
        self.should_use_fallback = names["gptqmodel.utils.fallback:should_use_fallback"]
        self.GPTQProcessor = names["gptqmodel.looper.gptq_processor:GPTQProcessor"]
        self.BaseQModel = names["gptqmodel.models.base:BaseQModel"]
        self.add_batch = names["gptqmodel.quantization.gptq:GPTQ.add_batch"]
        self.qualified_name = names["gptqmodel.utils.structure:_get_qualified_name"]
        self.safe_open = names["gptqmodel.utils.structure:safe_open"]
        self.supported_types = names["gptqmodel.utils.model:SUPPORTS_MODULE_TYPES"]
        hooked = "gptqmodel.nn_modules.hooked_linear:"
        self.hooked_linear = {name: names[hooked + name] for name in (
            "_materialize_if_meta_weight", "emit_device_telemetry", "apply_online_hadamard", "_restore_output_device",
            "STOP_FORWARD_EXCEPTION")}
        self.task_class = None  # the processor's GPTQ while installed (gptq.make_task_class)
        self.routed = False     # whether defuser's routed experts' loop is qlink's


class GPTQLoop:
    """Whether GPTQModel's layer loop runs now with GPTQ's processor alone, whose hooks read
    only their module's input and whose process() hands a quantized weight over as a new
    tensor (contract.replaces_weights): refusal is None then, else why not."""

    OUTSIDE = "outside GPTQModel's layer loop"

    def __init__(self, gptq_processor, attention):
        self.gptq_processor, self.attention, self.refusal = gptq_processor, attention, self.OUTSIDE

    @contextlib.contextmanager
    def running(self, processors):
        """Inside the loop with these processors; every kept attention output dropped after."""
        others = sorted({type(p).__name__ for p in processors if not replaces_weights(p, self.gptq_processor)})
        self.refusal = "processors other than GPTQ's (%s)" % ", ".join(others) if others else None
        try:
            yield
        finally:
            self.refusal = self.OUTSIDE
            self.attention.detach_all()


class GPTQModelInstallation(Installation):
    def __init__(self, ctx, strict, seams, host_spec, read_ahead, switch_interval, fixed_segments,
                 hessian_precision, inverse, tf32, attention_outputs, tail_inputs, stopped_products,
                 expert_stage, expert_budget, cpu_workers):  # install()'s arguments, its defaults
        if read_ahead not in READ_AHEAD:
            raise ValueError("read_ahead must be one of %s, got %r" % (READ_AHEAD, read_ahead))
        if hessian_precision not in HESSIAN_PRECISIONS:
            raise ValueError("hessian_precision must be one of %s, got %r" % (HESSIAN_PRECISIONS, hessian_precision))
        inverse_code(inverse)
        for name, value in (("fixed_segments", fixed_segments), ("tf32", tf32),
                            ("attention_outputs", attention_outputs), ("tail_inputs", tail_inputs),
                            ("stopped_products", stopped_products),
                            ("expert_stage", expert_stage)):
            if not isinstance(value, bool):
                raise ValueError("%s must be True or False, got %r" % (name, value))
        if expert_budget is not None and (not isinstance(expert_budget, int) or expert_budget <= 0):
            raise ValueError("expert_budget must be a positive number of bytes or None, got %r" % (expert_budget,))
        if cpu_workers is not None and (not isinstance(cpu_workers, int) or isinstance(cpu_workers, bool)
                                        or cpu_workers < 2):
            raise ValueError("cpu_workers must be a number of threads, 2 or more (GPTQModel's model loader takes "
                             "2), or None, got %r" % (cpu_workers,))
        self.cpu_workers = cpu_workers
        self.switch_interval = check_interval(switch_interval)
        self.expert_stage, self.expert_budget = expert_stage, expert_budget
        self.fixed_segments = fixed_segments
        self.engine_options = {"inverse": inverse, "tf32": tf32}  # the engine's, for every solve
        self.stopped_products = stopped_products
        super().__init__(ctx, strict, seams, host_spec)
        self.host = _Host(self.names)
        self.read_ahead = read_ahead
        self.accumulator = HessianAccumulator(ctx, precision=hessian_precision)
        self.queue = Queue(self)  # add_batch's calls of a forward, made as one native call
        self.merges = SharedMerges()  # tasks of one input take one merged Hessian
        self.ahead = SolveAhead(self)  # a subset's tasks solved in one engine call
        self.packs = PackAhead()  # and their words packed with it
        self.expert_counts = ExpertCounts()  # the expert stage's blocks, experts and rows
        self.lookups = FinalizeLookups(self.counters, self.host.supported_types)  # finalizes' own paths
        self.paths = QualifiedNames(self.counters, self.host.qualified_name)  # the fills' module names, indexed
        # A layer's attention outputs kept across its forwards, where they run on one device.
        self.keep_attention = attention_outputs and torch.cuda.device_count() <= 1
        self.tail_inputs = tail_inputs
        self.attention = AttentionOutputs(self.counters)
        self.loop = GPTQLoop(self.host.GPTQProcessor, self.attention)
        pin = read_ahead == "pinned" and not ctx.cpu_memory and torch.cuda.is_available()
        self.prefetch = LayerPrefetch(self.host.safe_open, pin, self.counters, self.guard)
        # Each sample's tokens where the loop's cache holds grouped one-sample batches
        # (group_batches), None where its batches are GPTQModel's.
        self.sample_tokens = None

    def close(self):
        try:
            self.queue.flush()
        finally:
            self.prefetch.close()
            self.packs.clear()
            self.attention.detach_all()

    @property
    def grouped(self):
        """Whether the loop's forwards hold several one-sample batches (group_batches)."""
        return self.sample_tokens is not None

    def samples_in(self, tokens):
        """How many of the loop's samples a forward of `tokens` rows holds: more than one
        only in grouped forwards."""
        if self.grouped and tokens % self.sample_tokens == 0:
            return tokens // self.sample_tokens
        return 1

    def counter_sections(self):
        return {"hessians": self.accumulator.counters(), "solves": self.ahead.counters(),
                "packs": self.packs.counters(),
                "staging": self.ctx.pinned_staging.counters(), "experts": self.expert_counts.snapshot()}
