"""A block's experts through SignRound's experts calls (ABI 1.10) on the CPU backend: every
expert's quant-dequant, gradients and steps equal the per-layer calls' (1.7 / 1.9) bit for
bit; experts the router gave no tokens are skipped as AutoRound skips them (their wrapper
not called: nothing of them written, no step, but their best copies kept); refusals name
the argument and write nothing."""
import ctypes

import pytest
import torch

import qlink
from qlink import _abi
from qlink.quant import signround_qdq_experts, signsgd_experts_step, signsgd_step
from test_signround import COLS, ROWS, _inputs

EXPERTS = 5
OPTIONS = {"bits": 4, "group_size": 64, "sym": True, "scale_dtype": torch.float16, "q_scale_thresh": 1e-5}
SENTINEL = 7.0  # what an output not written keeps


@pytest.fixture(scope="module")
def cpu2(library):
    with qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "off"}, library=library) as ctx:
        yield ctx


def _experts(group_size, dtype, seed, count=EXPERTS):
    """Per expert (weight, v, min_scale, max_scale, upstream gradient), each its own draw."""
    out = []
    for e in range(count):
        w, v, lo, hi = _inputs(group_size, dtype, seed=seed + 17 * e)
        upstream = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(seed + 17 * e + 1)).to(dtype)
        out.append((w, v, lo, hi, upstream))
    return out


def _forward_layers(experts, name="e"):
    return [{"name": "%s%d" % (name, i), "weight": w, "v": v.clone(), "min_scale": lo.clone(),
             "max_scale": hi.clone(), "qdq": torch.full_like(w, SENTINEL)} for i, (w, v, lo, hi, _) in
            enumerate(experts)]


def _backward_layers(experts, step=False):
    layers = []
    for i, (w, v, lo, hi, g) in enumerate(experts):
        layer = {"name": "e%d" % i, "weight": w, "v": v.clone(), "min_scale": lo.clone(), "max_scale": hi.clone(),
                 "grad_qdq": g, "grad_min_scale": torch.full_like(lo, SENTINEL),
                 "grad_max_scale": torch.full_like(hi, SENTINEL)}
        if step:
            layer.update(lr_group=i % 2, best_v=torch.full_like(v, SENTINEL))
        else:
            layer["grad_v"] = torch.full_like(v, SENTINEL)
        layers.append(layer)
    return layers


def _same(a, b, what):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=what)


def _assert_layers_equal(grouped, single, fields, skip=()):
    for i, (g, s) in enumerate(zip(grouped, single)):
        if i in skip:
            continue
        for field in fields:
            _same(g[field], s[field], "expert %d: %s" % (i, field))


CASES = [(4, 64, True, torch.bfloat16), (2, 32, False, torch.float16), (3, -1, True, torch.float32),
         (8, 128, False, torch.bfloat16)]


@pytest.mark.parametrize("bits,group_size,sym,dtype", CASES)
def test_every_pass_equals_the_per_layer_calls(cpu2, bits, group_size, sym, dtype):
    options = dict(OPTIONS, bits=bits, group_size=group_size, sym=sym)
    experts = _experts(group_size, dtype, seed=3)
    grouped, single = _forward_layers(experts), _forward_layers(experts)
    cpu2.signround_experts_qdq(grouped, options)
    for layer in single:
        cpu2.signround_qdq([layer], options)
    _assert_layers_equal(grouped, single, ("qdq", "min_scale", "max_scale"))

    grouped, single = _backward_layers(experts), _backward_layers(experts)
    cpu2.signround_experts_qdq(grouped, options, backward=True)
    for layer in single:
        cpu2.signround_qdq([layer], options, backward=True)
    _assert_layers_equal(grouped, single, ("grad_v", "grad_min_scale", "grad_max_scale"))

    lrs, loss, best_loss = torch.tensor([0.25, 0.005]), torch.tensor([1.0]), torch.tensor([2.0])
    step = {"step_lrs": lrs, "loss": loss, "best_loss": best_loss}
    grouped, single = _backward_layers(experts, step=True), _backward_layers(experts, step=True)
    cpu2.signround_experts_qdq(grouped, options, backward=True, step=step)
    for layer in single:
        cpu2.signround_qdq([layer], options, backward=True, step=step)
    _assert_layers_equal(grouped, single, ("v", "best_v", "grad_min_scale", "grad_max_scale"))


def _step_state(experts, seed):
    """Per expert three params (v, min_scale, max_scale) with gradients and best copies."""
    gen = torch.Generator().manual_seed(seed)
    params = []
    for _, v, lo, hi, _ in experts:
        params.append([{"param": t.clone(), "grad": torch.randn(t.shape, generator=gen), "best": torch.zeros_like(t),
                        "lr_group": k % 2} for k, t in enumerate((v, lo, hi))])
    schedule = {"lrs": torch.tensor([0.25, 0.005]), "epoch": torch.tensor([3]), "total_iters": 10,
                "loss": torch.tensor([1.0]), "best_loss": torch.tensor([2.0])}
    return params, schedule


def _signsgd(cpu2, flat, schedule, experts=None, tokens=None):
    s = dict(schedule)
    args = (flat, s.pop("lrs"))
    if experts is None:
        cpu2.signsgd_step(*args, **s)
    else:
        cpu2.signsgd_experts_step(flat, experts, args[1], tokens=tokens, **s)


def test_the_step_equals_signsgd_step(cpu2):
    experts = _experts(64, torch.bfloat16, seed=11)
    grouped, g_schedule = _step_state(experts, seed=12)
    single, s_schedule = _step_state(experts, seed=12)
    _signsgd(cpu2, [p for ps in grouped for p in ps], g_schedule, experts=EXPERTS)
    _signsgd(cpu2, [p for ps in single for p in ps], s_schedule)
    for ge, se in zip(grouped, single):
        for g, s in zip(ge, se):
            _same(g["param"], s["param"], "param")
            _same(g["best"], s["best"], "best")
    for key in ("lrs", "epoch", "best_loss"):
        _same(g_schedule[key], s_schedule[key], key)
    assert g_schedule["epoch"].item() == 4 and g_schedule["best_loss"].item() == 1.0


@pytest.mark.parametrize("token_dtype", [torch.int32, torch.int64])
def test_experts_without_tokens_are_skipped(cpu2, token_dtype):
    """tokens [3, 0, 5, 0, 1]: experts 1 and 3 keep every output as it was (their range
    factors, which _inputs puts partly outside [0, 1], unclamped), the others equal the
    per-layer calls."""
    tokens = torch.tensor([3, 0, 5, 0, 1], dtype=token_dtype)
    empty = (1, 3)
    experts = _experts(64, torch.bfloat16, seed=21)
    grouped, single = _forward_layers(experts), _forward_layers(experts)
    cpu2.signround_experts_qdq(grouped, OPTIONS, tokens=tokens)
    for layer in single:
        cpu2.signround_qdq([layer], OPTIONS)
    _assert_layers_equal(grouped, single, ("qdq", "min_scale", "max_scale"), skip=empty)
    for i in empty:
        w, _, lo, hi, _ = experts[i]
        assert torch.equal(grouped[i]["qdq"], torch.full_like(w, SENTINEL))
        assert torch.equal(grouped[i]["min_scale"], lo) and torch.equal(grouped[i]["max_scale"], hi)
        assert (lo < 0).any() or (lo > 1).any()  # the clamp would have moved them

    grouped, single = _backward_layers(experts), _backward_layers(experts)
    cpu2.signround_experts_qdq(grouped, OPTIONS, tokens=tokens, backward=True)
    for layer in single:
        cpu2.signround_qdq([layer], OPTIONS, backward=True)
    _assert_layers_equal(grouped, single, ("grad_v", "grad_min_scale", "grad_max_scale"), skip=empty)
    for i in empty:
        for field in ("grad_v", "grad_min_scale", "grad_max_scale"):
            assert (grouped[i][field] == SENTINEL).all(), field


@pytest.mark.parametrize("improved", [True, False])
def test_experts_without_tokens_take_no_step_but_are_kept_as_best(cpu2, improved):
    tokens = torch.tensor([0, 2, 0, 0, 9])
    empty = (0, 2, 3)
    best_loss = 2.0 if improved else 0.5
    experts = _experts(32, torch.float16, seed=31)
    options = dict(OPTIONS, group_size=32)
    step = {"step_lrs": torch.tensor([0.25, 0.005]), "loss": torch.tensor([1.0]),
            "best_loss": torch.tensor([best_loss])}
    grouped, single = _backward_layers(experts, step=True), _backward_layers(experts, step=True)
    cpu2.signround_experts_qdq(grouped, options, tokens=tokens, backward=True, step=step)
    for layer in single:
        cpu2.signround_qdq([layer], options, backward=True, step=step)
    _assert_layers_equal(grouped, single, ("v", "best_v", "grad_min_scale", "grad_max_scale"), skip=empty)
    for i in empty:
        v = experts[i][1]
        assert torch.equal(grouped[i]["v"], v)
        assert torch.equal(grouped[i]["best_v"], v if improved else torch.full_like(v, SENTINEL))

    # The range factors' step: AutoRound's SignSGD over the params with a gradient (the
    # experts with tokens) alone; every expert's params kept as best; one schedule step.
    grouped, g_schedule = _step_state(experts, seed=32)
    single, s_schedule = _step_state(experts, seed=32)
    g_schedule["best_loss"] = torch.tensor([best_loss])
    s_schedule["best_loss"] = torch.tensor([best_loss])
    before = [[p["param"].clone() for p in ps] for ps in grouped]
    _signsgd(cpu2, [p for ps in grouped for p in ps], g_schedule, experts=EXPERTS, tokens=tokens)
    _signsgd(cpu2, [p for i, ps in enumerate(single) if i not in empty for p in ps], s_schedule)
    for i, (ge, se) in enumerate(zip(grouped, single)):
        for k, (g, s) in enumerate(zip(ge, se)):
            _same(g["param"], before[i][k] if i in empty else s["param"], "expert %d param %d" % (i, k))
            kept = before[i][k] if improved else torch.zeros_like(g["best"])
            _same(g["best"], kept, "expert %d best %d" % (i, k))
    for key in ("lrs", "epoch", "best_loss"):
        _same(g_schedule[key], s_schedule[key], key)


def test_the_python_front_matches_autorounds_per_expert_path(cpu2):
    """signround_qdq_experts and signsgd_experts_step: an expert without tokens gets zero
    gradients (or none at all for the step) and keeps its parameters, as AutoRound's expert
    whose wrapper is not called; the others as signround_qdq one by one."""
    from qlink.quant import signround_qdq
    tokens = torch.tensor([4, 0, 1])
    experts = _experts(64, torch.bfloat16, seed=41, count=3)
    lrs = torch.tensor([0.01])

    def tuned():
        return [[t.clone().requires_grad_(True) for t in (v, lo.clamp(0, 1), hi.clamp(0, 1))]
                for _, v, lo, hi, _ in experts]
    grouped, single = tuned(), tuned()
    outs = signround_qdq_experts([("e%d" % i, e[0], *grouped[i]) for i, e in enumerate(experts)], tokens=tokens,
                                 group_size=64, ctx=cpu2)
    torch.autograd.backward([outs[i] for i in (0, 2)], [experts[i][4] for i in (0, 2)])
    for i in (0, 2):
        signround_qdq(experts[i][0], *single[i], group_size=64, ctx=cpu2).backward(experts[i][4])
        for g, s in zip(grouped[i], single[i]):
            _same(g.grad, s.grad, "expert %d gradient" % i)
    assert all(t.grad is None or not t.grad.any() for t in grouped[1])
    for t in grouped[1]:
        t.grad = None  # AutoRound's: the expert's wrapper never ran
    signsgd_experts_step(grouped, lrs.clone(), tokens=tokens, ctx=cpu2)
    signsgd_step([t for i in (0, 2) for t in single[i]], lrs.clone(), ctx=cpu2)
    for i in (0, 2):
        for g, s in zip(grouped[i], single[i]):
            _same(g.detach(), s.detach(), "expert %d param" % i)
    for t, ref in zip(grouped[1], (experts[1][1], experts[1][2].clamp(0, 1), experts[1][3].clamp(0, 1))):
        _same(t.detach(), ref, "expert 1 param")


def _unchanged(layers, experts):
    for layer, (w, v, lo, hi, _) in zip(layers, experts):
        assert torch.equal(layer["qdq"], torch.full_like(w, SENTINEL))
        assert torch.equal(layer["min_scale"], lo) and torch.equal(layer["max_scale"], hi)


def test_refusals_name_the_argument_and_write_nothing(cpu2):
    experts = _experts(64, torch.bfloat16, seed=51)
    tall = [torch.cat([t] * 2) for t in experts[2][:4]]  # twice the rows, consistent in itself
    cases = [
        ({2: {"weight": tall[0], "v": tall[1], "min_scale": tall[2], "max_scale": tall[3],
              "qdq": torch.full_like(tall[0], SENTINEL)}}, {},
         "args->layers->layers[2] 'e2': weight has shape (12, 256) and dtype bfloat16, unlike layers[0]'s "
         "(6, 256) bfloat16"),
        ({1: {"weight": experts[1][0].half(), "qdq": torch.full_like(experts[1][0].half(), SENTINEL)}}, {},
         "args->layers->layers[1] 'e1': weight has shape (6, 256) and dtype float16, unlike"),
        ({3: {"device": 1}}, {}, "args->layers->layers[3] 'e3': weight is on device 1, not layers[0]'s device 0"),
        ({4: {"v": None}}, {}, "args->layers->layers[4] 'e4': v is NULL"),
        ({}, {"bits": 5}, "args->layers->options->bits = 5 is not one of 2, 3, 4, 8"),
        ({}, {"tokens": torch.ones(4, dtype=torch.int64)}, "args->tokens has shape (4,), expected (5,)"),
        ({}, {"tokens": torch.ones(5)}, "args->tokens has dtype float32, expected int32 or int64"),
    ]
    for changes, extra, message in cases:
        layers = _forward_layers(experts)
        for i, change in changes.items():
            layers[i].update(change)
        tokens = extra.pop("tokens", None)
        with pytest.raises(qlink.InvalidArgumentError) as e:
            cpu2.signround_experts_qdq(layers, dict(OPTIONS, **extra), tokens=tokens)
        assert message in str(e.value)
        kept = [i for i in range(EXPERTS) if i not in changes]
        _unchanged([layers[i] for i in kept], [experts[i] for i in kept])


def test_raw_refusals(cpu2):
    """What the Python front cannot send: NULL args->layers or step, a struct_size before
    1.10, tokens on another device than the experts."""
    from qlink._dlpack import TensorArray
    experts = _experts(64, torch.bfloat16, seed=55)
    layers = _forward_layers(experts)
    keep, inner = cpu2._signround_args(layers, OPTIONS, None, None)
    tokens = TensorArray([torch.ones(EXPERTS, dtype=torch.int64)], [1])
    args = _abi.SignRoundExpertsArgs(ctypes.sizeof(_abi.SignRoundExpertsArgs), ctypes.pointer(inner),
                                     ctypes.addressof(tokens.array))
    with pytest.raises(qlink.InvalidArgumentError, match="args->tokens is on device 1, not the weight's device 0"):
        cpu2.invoke("signround_experts_qdq", ctypes.byref(args))
    _unchanged(layers, experts)
    with pytest.raises(qlink.InvalidArgumentError, match="args->layers is NULL"):
        args = _abi.SignRoundExpertsArgs(ctypes.sizeof(_abi.SignRoundExpertsArgs), None, None)
        cpu2.invoke("signround_experts_qdq", ctypes.byref(args))
    with pytest.raises(qlink.InvalidArgumentError, match="args->struct_size 16 is below the 1.10 size 24"):
        args = _abi.SignRoundExpertsArgs(16, None, None)
        cpu2.invoke("signround_experts_qdq_backward", ctypes.byref(args))
    with pytest.raises(qlink.InvalidArgumentError, match="args->step is NULL"):
        args = _abi.SignSgdExpertsArgs(ctypes.sizeof(_abi.SignSgdExpertsArgs), None, 1, None)
        cpu2.invoke("signsgd_experts_step", ctypes.byref(args))


def test_step_refusals_write_nothing(cpu2):
    experts = _experts(64, torch.bfloat16, seed=61)
    cases = [
        (0, None, None, "args->num_experts = 0 does not divide args->step's 15 params"),
        (4, None, None, "args->num_experts = 4 does not divide args->step's 15 params"),
        (EXPERTS, (3, 1, torch.ones(5)), None,
         "args->step->params[10] (expert 3's tensor 1) has 5 elements, unlike expert 0's"),
        (EXPERTS, (2, 0, "grad"), None, "args->step->params[6]: grad has shape (2, 64), expected param's"),
        (EXPERTS, None, torch.ones(3, dtype=torch.int32), "args->tokens has shape (3,), expected (5,)"),
    ]
    for num_experts, change, tokens, message in cases:
        params, schedule = _step_state(experts, seed=62)
        if change is not None:
            e, k, t = change
            if t == "grad":
                params[e][k]["grad"] = torch.ones(2, 64)
            else:
                params[e][k].update(param=t, grad=torch.ones_like(t), best=torch.zeros_like(t))
        before = [[p["param"].clone() for p in ps] for ps in params]
        lrs = schedule["lrs"].clone()
        with pytest.raises(qlink.InvalidArgumentError) as e:
            _signsgd(cpu2, [p for ps in params for p in ps], schedule, experts=num_experts, tokens=tokens)
        assert message in str(e.value)
        for ps, bs in zip(params, before):
            for p, b in zip(ps, bs):
                assert torch.equal(p["param"], b) and not p["best"].any()
        assert torch.equal(schedule["lrs"], lrs) and schedule["epoch"].item() == 3
