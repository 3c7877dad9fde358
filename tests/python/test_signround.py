"""SignRound's native engine (ABI 1.7) on the CPU backend against the tests' reference of
AutoRound's arithmetic (signround_reference.py): the quant-dequant bit-identical for every
option combination, its gradients as autograd takes them through the reference, the
SignSGD step and LinearLR schedule as AutoRound's, and refusals that write nothing."""
import itertools

import pytest
import torch

import qlink
from qlink.quant import signround_qdq, signsgd_step
from signround_reference import ReferenceSignSGD, reference_qdq, reference_schedule

BITS = [2, 3, 4, 8]
GROUP_SIZES = [-1, 32, 64, 128]
WEIGHT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SCALE_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
ROWS, COLS = 6, 256


@pytest.fixture(scope="module")
def cpu2(library):
    with qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "off"}, library=library) as ctx:
        yield ctx


def _inputs(group_size, dtype, seed):
    """A weight with the groups that reach every branch: all-positive and all-negative
    groups, an all-zero row; v in [-0.5, 0.5]; range factors around [0, 1] (clamped by the
    forward), some 0 (the scale falls to q_scale_thresh, the ranges tie)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(ROWS, COLS, generator=gen) * 0.05
    w[1] = w[1].abs()
    w[2] = -w[2].abs()
    w[3] = 0
    w = w.to(dtype)
    group_len = COLS if group_size == -1 else group_size
    groups = ROWS * COLS // group_len
    v = torch.rand(groups, group_len, generator=gen) - 0.5
    factors = []
    for _ in range(2):
        f = torch.rand(groups, generator=gen) * 1.4 - 0.1
        f[::5] = 0
        factors.append(f)
    return w, v, factors[0], factors[1]


def _run(fn, w, v, lo, hi, upstream, **options):
    """fn's output and the gradients of v, min_scale, max_scale for upstream, on copies."""
    v, lo, hi = (t.clone().requires_grad_(True) for t in (v, lo, hi))
    out = fn(w, v, lo, hi, **options)
    out.backward(upstream)
    return out.detach(), v.grad, lo.grad, hi.grad, lo.detach(), hi.detach()


def _scale_ulp(dtype, x):
    """One unit in the last place of the scale's dtype at |x| (the sums behind a range
    factor's gradient are rounded to it; a different order of additions can move it one)."""
    bits = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}[dtype]
    return torch.ldexp(torch.ones_like(x), torch.frexp(x.abs().clamp(min=1e-30))[1] - 1 - bits)


def _rolled_within_groups(t, group_size, shift):
    """t (rows, columns) with each group's columns rotated by `shift`: every element's
    forward is unchanged, autograd's per-group sums add in another order."""
    rows, cols = t.shape
    g = cols if group_size == -1 else group_size
    return t.reshape(rows, cols // g, g).roll(shift, -1).reshape(rows, cols)


@pytest.mark.parametrize("bits,group_size,sym", list(itertools.product(BITS, GROUP_SIZES, [True, False])))
def test_qdq_and_gradients_match_autoround(cpu2, bits, group_size, sym):
    for k, (wdtype, sdtype) in enumerate(itertools.product(WEIGHT_DTYPES, SCALE_DTYPES)):
        w, v, lo, hi = _inputs(group_size, wdtype, seed=bits * 1000 + group_size * 10 + k)
        upstream = torch.randn(w.shape, generator=torch.Generator().manual_seed(k)).to(wdtype)
        thresh = 1e-8 if sdtype == torch.float32 else 1e-5  # WrapperLinear's choice
        options = dict(bits=bits, group_size=group_size, sym=sym, scale_dtype=sdtype, q_scale_thresh=thresh)
        got = _run(lambda *a, **o: signround_qdq(*a, ctx=cpu2, **o), w, v, lo, hi, upstream, **options)
        want = _run(reference_qdq, w, v, lo, hi, upstream, **options)
        reorders = []
        for shift in (1, 3, 7):
            roll = lambda t: _rolled_within_groups(t.reshape(w.shape), group_size, shift).reshape(t.shape)  # noqa
            reorders.append(_run(reference_qdq, roll(w), roll(v), lo, hi, roll(upstream), **options))
        what = "weight %s, scale %s" % (wdtype, sdtype)
        assert got[0].dtype == wdtype
        assert torch.equal(got[0], want[0]), what + ": qdq differs"
        assert torch.equal(got[4], want[4]) and torch.equal(got[5], want[5]), what + ": range factors not clamped alike"
        assert torch.equal(got[1], want[1]), what + ": grad of v differs"
        for f in (2, 3):  # min_scale, max_scale
            g, r = got[f], want[f]
            # The per-group sums behind these add in another order than ATen's reduction.
            # How much an order moves a result shows in the reference itself, its groups'
            # columns rotated (cancellation in a sum amplifies it): the engine stays within a
            # few times that, or a unit of the scale dtype's last place where it does not move.
            spread = torch.stack([(r - other[f]).abs().nan_to_num(0) for other in reorders]).max(0)[0]
            same = (g == r) | (g.isnan() & r.isnan())
            tolerance = 8 * spread + 2 * _scale_ulp(sdtype, r) + 1e-5 * r.abs() + 1e-6 * r.abs().nan_to_num(0).max()
            off = torch.where(same, torch.zeros_like(g), (g - r).abs() - tolerance).nan_to_num(1.0)
            assert torch.all(off <= 0), "%s: range factor gradient %s, reference %s (spread %s)" % (
                what, g[off.argmax()].item(), r[off.argmax()].item(), spread[off.argmax()].item())


def test_default_scale_dtype_and_threshold_are_autorounds(cpu2):
    w, v, lo, hi = _inputs(128, torch.bfloat16, seed=7)
    got = signround_qdq(w, v, lo.clone(), hi.clone(), bits=4, group_size=128, sym=True, ctx=cpu2)
    assert torch.equal(got, reference_qdq(w, v, lo.clone(), hi.clone(), 4, 128, True))


def test_v_in_the_weights_shape_is_accepted(cpu2):
    w, v, lo, hi = _inputs(64, torch.bfloat16, seed=3)
    got = signround_qdq(w, v.reshape(ROWS, COLS), lo.clone(), hi.clone(), bits=4, group_size=64, ctx=cpu2)
    assert torch.equal(got, reference_qdq(w, v, lo.clone(), hi.clone(), 4, 64, True))


def test_signsgd_step_and_schedule_match_autoround(cpu2):
    """Two learning-rate groups (AutoRound's rounding and min-max groups), iters steps of
    LinearLR; the best parameters kept on the device whenever the loss improves."""
    iters = 7
    gen = torch.Generator().manual_seed(0)
    shapes = [(4, 64), (4,), (4,)]
    start = [torch.randn(s, generator=gen) for s in shapes]
    ours = [t.clone().requires_grad_(True) for t in start]
    theirs = [t.clone().requires_grad_(True) for t in start]
    reference = ReferenceSignSGD([(theirs[:1], 1.0 / iters), (theirs[1:], 0.003)])
    schedule = reference_schedule(reference, iters)
    lrs = torch.tensor([1.0 / iters, 0.003])
    epoch = torch.zeros(1, dtype=torch.int64)
    best = [torch.zeros_like(t) for t in start]
    best_loss = torch.tensor([torch.finfo(torch.float32).max])
    losses = [5.0, 4.0, 4.5, 3.0, 3.0, 3.5, 2.0]
    kept, kept_loss = None, float("inf")
    for i in range(iters):
        grads = [torch.randn(s, generator=gen) for s in shapes]
        grads[0][0, :8] = 0  # sign(0) = 0: no move
        for p, q, g in zip(ours, theirs, grads):
            p.grad, q.grad = g.clone(), g.clone()
        if losses[i] < kept_loss:  # AutoRound: collect_best_params before the step
            kept, kept_loss = [q.detach().clone() for q in theirs], losses[i]
        signsgd_step(ours, lrs, lr_groups=[0, 1, 1], epoch=epoch, total_iters=iters, loss=torch.tensor([losses[i]]),
                     best_loss=best_loss, best=best, ctx=cpu2)
        reference.step()
        schedule.step()
        for p, q in zip(ours, theirs):
            assert torch.equal(p.detach(), q.detach()), "step %d: parameters differ" % i
        want_lrs = torch.stack([group["lr"].reshape(()).float() for group in reference.param_groups])
        assert torch.equal(lrs, want_lrs), "step %d: learning rates %s, AutoRound's %s" % (i, lrs, want_lrs)
        assert int(epoch) == i + 1
        assert float(best_loss) == kept_loss
        for b, k in zip(best, kept):
            assert torch.equal(b, k), "step %d: best parameters differ" % i
    assert torch.equal(lrs, torch.zeros(2)), "LinearLR ends at 0"


def _layer(group_size=64, **overrides):
    w, v, lo, hi = _inputs(group_size, torch.bfloat16, seed=11)
    layer = {"name": "q_proj", "weight": w, "v": v, "min_scale": lo, "max_scale": hi, "qdq": torch.zeros_like(w)}
    layer.update(overrides)
    return layer


OPTIONS = {"bits": 4, "group_size": 64, "sym": True, "scale_dtype": torch.float16, "q_scale_thresh": 1e-5}


@pytest.mark.parametrize("layer,options,message", [
    ({}, {"bits": 5}, "options->bits = 5 is not one of 2, 3, 4, 8"),
    ({}, {"group_size": 48}, "layers[0] 'q_proj': options->group_size 48 does not divide the weight's 256 columns"),
    ({}, {"group_size": 0}, "options->group_size = 0 is neither -1"),
    ({}, {"scale_dtype": torch.int32}, "options->scale_dtype is int32, expected float16, bfloat16 or float32"),
    ({}, {"q_scale_thresh": 0.0}, "options->q_scale_thresh = 0.000000 is not a finite value > 0"),
    ({"v": torch.zeros(24, 32)}, {}, "layers[1] 'q_proj': v has shape (24, 32), expected (24, 64)"),
    ({"v": torch.zeros(24, 64, dtype=torch.float16)}, {}, "layers[1] 'q_proj': v has dtype float16, expected float32"),
    ({"min_scale": torch.zeros(23)}, {}, "layers[1] 'q_proj': min_scale has shape (23,), expected (24,)"),
    ({"qdq": torch.zeros(ROWS, COLS)}, {}, "layers[1] 'q_proj': qdq has dtype float32, expected the weight's bfloat16"),
    ({"qdq": None}, {}, "layers[1] 'q_proj': qdq is NULL"),
    ({"weight": torch.zeros(ROWS, COLS, dtype=torch.int32)}, {}, "weight has dtype int32, expected float32"),
    ({"device": {"max_scale": 1}}, {}, "layers[1] 'q_proj': max_scale is on device 1, not the weight's device 0"),
])
def test_refusals_name_layer_and_field_and_write_nothing(cpu2, layer, options, message):
    first, second = _layer(), _layer(**layer)
    before = [t.clone() for t in (first["qdq"], first["min_scale"], second["min_scale"])]
    with pytest.raises(qlink.InvalidArgumentError) as e:
        cpu2.signround_qdq([first, second], dict(OPTIONS, **options))
    assert message in str(e.value)
    after = (first["qdq"], first["min_scale"], second["min_scale"])
    assert all(torch.equal(b, a) for b, a in zip(before, after)), "a refused call wrote"


def test_backward_refusals(cpu2):
    layer = _layer(qdq=None, grad_qdq=torch.zeros(ROWS, COLS, dtype=torch.bfloat16), grad_v=torch.zeros(24, 64))
    layer["grad_max_scale"] = torch.zeros(24, dtype=torch.float64)
    with pytest.raises(qlink.InvalidArgumentError, match="layers\\[0\\] 'q_proj': grad_max_scale has dtype float64"):
        cpu2.signround_qdq([layer], OPTIONS, backward=True)
    del layer["grad_max_scale"]
    layer["grad_qdq"] = None
    with pytest.raises(qlink.InvalidArgumentError, match="layers\\[0\\] 'q_proj': grad_qdq is NULL"):
        cpu2.signround_qdq([layer], OPTIONS, backward=True)


def test_step_refusals_write_nothing(cpu2):
    p, g = torch.ones(8), torch.ones(8)
    lrs = torch.tensor([0.5])
    cases = [
        ([{"param": p, "grad": torch.ones(4)}], {}, "params[0]: grad has shape (4,), expected param's (8,)"),
        ([{"param": p, "grad": g, "lr_group": 1}], {}, "params[0]: lr_group = 1 is outside args->lrs' 1 groups"),
        ([{"param": p, "grad": g, "device": 1}], {}, "params[0]: param is on device 1, not args->lrs's device 0"),
        ([{"param": p, "grad": g}], {"epoch": torch.zeros(1, dtype=torch.int32), "total_iters": 3},
         "args->epoch has dtype int32, expected int64"),
        ([{"param": p, "grad": g}], {"epoch": torch.zeros(1, dtype=torch.int64)}, "args->total_iters = 0 is below 1"),
        ([{"param": p, "grad": g}], {"loss": torch.zeros(1)}, "args->best_loss is NULL"),
    ]
    for params, extra, message in cases:
        with pytest.raises(qlink.InvalidArgumentError) as e:
            cpu2.signsgd_step(params, lrs, **extra)
        assert message in str(e.value)
        assert torch.equal(p, torch.ones(8)) and torch.equal(lrs, torch.tensor([0.5]))


@pytest.mark.parametrize("improved", [True, False])
@pytest.mark.parametrize("group_size,weight_dtype", [(64, torch.bfloat16), (-1, torch.float16), (32, torch.float32)])
def test_a_backward_with_the_step_equals_the_backward_then_signsgd(cpu2, group_size, weight_dtype, improved):
    """v's SignSGD step inside the backward (ABI 1.9): v and its kept copy as the backward
    writing grad_v and a signsgd_step reading it leave them, bit for bit; the range
    factors' gradients as the plain backward's; best_loss only read."""
    options = dict(OPTIONS, group_size=group_size)
    w, v, lo, hi = _inputs(group_size, weight_dtype, seed=5)
    upstream = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(6)).to(weight_dtype)
    lrs, loss = torch.tensor([0.25, 0.005]), torch.tensor([1.0])
    best_loss = torch.tensor([2.0 if improved else 0.5])

    def layer(v):
        return {"name": "up", "weight": w, "v": v, "min_scale": lo.clone(), "max_scale": hi.clone(),
                "grad_qdq": upstream, "grad_min_scale": torch.empty_like(lo), "grad_max_scale": torch.empty_like(hi)}
    plain = dict(layer(v.clone()), grad_v=torch.empty_like(v))
    cpu2.signround_qdq([plain], options, backward=True)
    stepped, kept = plain["v"].clone(), torch.full_like(v, 7.0)
    cpu2.signsgd_step([{"param": stepped, "grad": plain["grad_v"], "best": kept, "lr_group": 1}], lrs.clone(),
                      loss=loss, best_loss=best_loss.clone())

    fused = dict(layer(v.clone()), lr_group=1, best_v=torch.full_like(v, 7.0))
    cpu2.signround_qdq([fused], options, backward=True,
                       step={"step_lrs": lrs, "loss": loss, "best_loss": best_loss})
    assert torch.equal(fused["v"], stepped)
    assert torch.equal(fused["best_v"], kept)
    assert torch.equal(fused["best_v"], v) == improved
    for key in ("grad_min_scale", "grad_max_scale"):  # NaN where AutoRound's arithmetic makes one
        torch.testing.assert_close(fused[key], plain[key], rtol=0, atol=0, equal_nan=True, msg=key)
    assert best_loss.item() == (2.0 if improved else 0.5)


def test_the_step_in_signround_qdq_layers_leaves_v_without_a_gradient(cpu2):
    """VStep through the autograd Function: v steps in the backward, no v.grad; the range
    factors' gradients as without it."""
    from qlink.quant.signround import VStep, signround_qdq_layers
    w, v, lo, hi = _inputs(64, torch.bfloat16, seed=8)
    upstream = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    outs = []
    for step in (None, VStep(lrs=torch.tensor([0.1]), lr_groups=[0])):
        tuned = [t.clone().requires_grad_(True) for t in (v, lo, hi)]
        qdq, = signround_qdq_layers([("up", w, *tuned)], group_size=64, ctx=cpu2, step=step)
        qdq.backward(upstream)
        outs.append(tuned)
    (v0, lo0, hi0), (v1, lo1, hi1) = outs
    assert v1.grad is None and torch.equal(v1.detach(), (v0 - 0.1 * v0.grad.sign()).detach())
    assert torch.equal(lo1.grad, lo0.grad) and torch.equal(hi1.grad, hi0.grad)


def test_step_backward_refusals_write_nothing(cpu2):
    lrs = torch.tensor([0.5])
    base = _layer(qdq=None, grad_qdq=torch.zeros(ROWS, COLS, dtype=torch.bfloat16))
    cases = [
        (dict(grad_v=torch.zeros(24, 64)), {"step_lrs": lrs},
         "layers[0] 'q_proj': grad_v must be NULL with args->step_lrs"),
        (dict(lr_group=2), {"step_lrs": lrs}, "layers[0] 'q_proj': lr_group = 2 is outside args->step_lrs' 1 groups"),
        (dict(best_v=torch.zeros(24, 32)), {"step_lrs": lrs},
         "layers[0] 'q_proj': best_v has shape (24, 32), expected (24, 64)"),
        ({}, {"step_lrs": lrs, "loss": torch.zeros(1)}, "args->best_loss is NULL"),
        ({}, {"step_lrs": torch.zeros(2, 2)}, "args->step_lrs has shape (2, 2)"),
        (dict(grad_v=torch.zeros(24, 64)), {"loss": torch.zeros(1)}, "args->loss and args->best_loss go with"),
    ]
    for overrides, step, message in cases:
        layer = dict(base, v=base["v"].clone(), **overrides)
        with pytest.raises(qlink.InvalidArgumentError) as e:
            cpu2.signround_qdq([layer], OPTIONS, backward=True, step=step)
        assert message in str(e.value)
        assert torch.equal(layer["v"], base["v"]), "a refused step wrote v"
    with pytest.raises(qlink.InvalidArgumentError, match="args->step_lrs is signround_qdq_backward's"):
        cpu2.signround_qdq([_layer()], OPTIONS, step={"step_lrs": lrs})
    first, second = dict(base, v=base["v"].clone()), dict(base, v=base["v"].clone(), device=1)
    with pytest.raises(qlink.InvalidArgumentError,
                       match="layers\\[1\\] 'q_proj': weight is on device 1, not args->step_lrs' device 0"):
        cpu2.signround_qdq([first, second], OPTIONS, backward=True, step={"step_lrs": lrs})
    assert torch.equal(first["v"], base["v"]), "a refused step wrote v"


def test_a_step_needs_the_layer_struct_of_1_9(cpu2, monkeypatch):
    """A 1.7-sized layer struct has no best_v or lr_group: a step asked of it is refused."""
    from qlink import engine
    made = engine._layer_specs

    def sized_1_7(*args):
        array, names, specs = made(*args)
        for spec in specs:
            spec.struct_size = 88  # QLINK_SIGNROUND_LAYER_STRUCT_SIZE_1_7
        return array, names, specs
    monkeypatch.setattr(engine, "_layer_specs", sized_1_7)
    layer = _layer(qdq=None, grad_qdq=torch.zeros(ROWS, COLS, dtype=torch.bfloat16))
    before = layer["v"].clone()
    with pytest.raises(qlink.InvalidArgumentError, match="struct_size 88 ends before best_v and lr_group"):
        cpu2.signround_qdq([layer], OPTIONS, backward=True, step={"step_lrs": torch.tensor([0.5])})
    assert torch.equal(layer["v"], before)
