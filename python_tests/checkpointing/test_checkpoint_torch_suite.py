"""PyTorch's own checkpoint tests, rewritten for torch_offload.checkpoint.

Sources (read, not copied): test/test_utils.py TestCheckpoint, the non-reentrant checkpoint tests of
test/test_autograd.py (TestAutograd), its nested-checkpoint tests and TestSelectiveActivationCheckpoint.
Each case runs through our checkpoint and asserts what torch's test asserts: values and gradients
equal to torch's checkpoint or to no checkpointing (bit for bit in fp32), or torch's error. Tests of
the reentrant variant are in test_reentrant.py; the nested-checkpoint and selective-checkpointing
ones in test_checkpoint_torch_suite_sac.py.
Not brought over: checkpoint_sequential (torch_offload has none), torch.compile / dynamo cases,
tensor-subclass dispatch sizes, DataParallel and multi-GPU device-state inference (torch's own
helpers, unchanged by us).
"""

import contextlib
import os

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import CheckpointError, GraphExecGroup, set_checkpoint_early_stop

from python_tests.support.devices import DEVICES, cuda_only
from python_tests.support.torch_checkpoint_pair import _assert_matches_torch, ours, theirs


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 20), nn.ReLU(), nn.Linear(20, 5), nn.ReLU())


# --- test_utils.TestCheckpoint --------------------------------------------------------------------

def test_checkpoint_trigger_counts_forward_runs():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.counter = 0

        def forward(self, x):
            self.counter += 1
            return x * torch.tensor(2.0)

    modules = [Net() for _ in range(10)]
    h = torch.randn(3, 4, requires_grad=True)
    for m in modules:
        h = ours(m, h)
    assert all(m.counter == 1 for m in modules)
    h.sum().backward()
    assert all(m.counter == 2 for m in modules)  # each recomputed once


@pytest.mark.parametrize("segments", [1, 2, 3])
def test_checkpointed_segments_match_no_checkpointing(segments):
    model = _mlp()
    x = torch.randn(1, 100, requires_grad=True)
    out = model(x)
    out.sum().backward()
    reference = [p.grad.clone() for p in model.parameters()], x.grad.clone(), out.detach()
    model.zero_grad()
    x.grad = None
    layers = list(model.children())
    bounds = [round(i * len(layers) / segments) for i in range(segments + 1)]
    h = x
    for start, end in zip(bounds, bounds[1:]):
        h = ours(nn.Sequential(*layers[start:end]), h)
    h.sum().backward()
    assert torch.equal(h.detach(), reference[2]) and torch.equal(x.grad, reference[1])
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), reference[0]))


def test_autograd_grad_with_create_graph_works():
    # torch: "torch.utils.checkpoint is incompatible" with autograd.grad for reentrant; fine here.
    model = _mlp()
    x = torch.randn(1, 100, requires_grad=True)
    expected = torch.autograd.grad(model(x), x, torch.ones(1, 5), create_graph=True)
    out = ours(model, x)
    assert torch.equal(out, model(x))
    got = torch.autograd.grad(out, x, torch.ones(1, 5), create_graph=True)
    assert torch.equal(got[0], expected[0])


@pytest.mark.parametrize("device", DEVICES)
def test_rng_state_replayed(device):
    for _ in range(3):
        inp = torch.randn(20000, device=device).requires_grad_()
        phase1, phase2 = nn.Dropout(), nn.Dropout()
        state = torch.get_rng_state() if device == "cpu" else torch.cuda.get_rng_state()
        ours(phase2, phase1(inp)).sum().backward()
        with_checkpoint = inp.grad
        (torch.set_rng_state if device == "cpu" else torch.cuda.set_rng_state)(state)
        inp.grad = None
        phase2(phase1(inp)).sum().backward()
        assert torch.equal(with_checkpoint, inp.grad)


def test_preserve_rng_state_false_runs():
    inp = torch.randn(2).requires_grad_()
    ours(nn.Dropout(), inp, preserve_rng_state=False).sum().backward()
    assert inp.grad is not None and inp.grad.shape == inp.shape


def test_none_argument():
    x = torch.randn(1, 100, requires_grad=True)
    ours(lambda a, b: a if b is None else a + b, x, None).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_non_tensor_inputs_and_outputs():
    def foo(t1, t2, scale, t3):
        t4 = t1 + t2 * t3
        t5 = t1 * t2 + t3
        t4 *= scale
        t5 *= scale
        return scale, t4, None, True, t5, "bar", t1

    t1, t2, t3 = torch.rand(10, requires_grad=True), torch.rand(10, requires_grad=True), torch.rand(10)
    res = ours(foo, t1, t2, 3, t3)
    assert res[0] == 3 and res[2] is None and res[3] is True and res[5] == "bar"
    assert torch.equal(res[1], (t1 + t2 * t3) * 3) and torch.equal(res[4], (t1 * t2 + t3) * 3)
    assert torch.equal(res[6], t1)
    assert res[6] is t1  # non-reentrant: an input returned as is stays the same tensor (a leaf)
    res[1].sum().backward(retain_graph=True)
    res[4].sum().backward(retain_graph=True)
    res[6].sum().backward()
    grads = t1.grad, t2.grad
    t1.grad = t2.grad = None
    ref = foo(t1, t2, 3, t3)
    torch.autograd.backward([ref[1].sum(), ref[4].sum(), ref[6].sum()])
    assert torch.equal(t1.grad, grads[0]) and torch.equal(t2.grad, grads[1])


def test_no_tensor_arguments():
    def foo(a, b, scale):
        return scale, (a + b) * scale, "bar"

    assert ours(foo, 0.5, 0.25, 4) == (4, 3.0, "bar")


def test_partial_grad():
    x, y = torch.randn(1, 4, requires_grad=True), torch.randn(1, 4)
    out = ours(lambda a, b: (a, b), x, y)
    out[0].sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    # Non-reentrant: an output that does not require grad is an ordinary autograd error.
    out = ours(lambda a, b: a, torch.randn(1, 4), torch.randn(1, 4, requires_grad=True))
    assert not out.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()


@cuda_only
def test_early_free_in_backward_matches_torch():
    def stats_of(checkpoint):
        stats = []
        x = torch.zeros(10, device="cuda", requires_grad=True)

        def fn(x):
            for idx in (2, 1, 0):
                x = x ** 2
                x.register_hook(lambda _g, idx=idx: stats.append(torch.cuda.memory_allocated()))
            return (x ** 2).sum()

        checkpoint(fn, x).backward()
        return stats

    ours_stats, torch_stats = stats_of(ours), stats_of(theirs)
    assert all(b < a for a, b in zip(ours_stats, ours_stats[1:]))  # freed at each step
    assert len(ours_stats) == len(torch_stats) == 3


@cuda_only
def test_device_context_is_kept_in_recompute():
    devices = []

    def fn(x):
        t = torch.empty(4)
        devices.append(t.device.type)
        return x * t.sum()

    x = torch.randn(4, device="cuda", requires_grad=True)
    with torch.device("cuda"):
        ours(fn, x).sum().backward()
    assert devices == ["cuda", "cuda"]


# --- test_autograd: non-reentrant checkpoint -----------------------------------------------------

def test_arbitrary_input_and_output_structures():
    def fn(d):
        return {"out": d["a"] * d["b"], "list": [d["a"].sin()]}

    a, b = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    out = ours(fn, {"a": a, "b": b})
    (out["out"].sum() + out["list"][0].sum()).backward()
    assert torch.equal(a.grad, b.detach() + a.detach().cos()) and torch.equal(b.grad, a.detach())


def test_parameter_used_in_an_output_and_inside():
    w = nn.Parameter(torch.randn(4, 4))

    def fn(x):
        return x @ w, w * 1

    x = torch.randn(2, 4, requires_grad=True)
    out, w_out = ours(fn, x)
    (out.sum() + w_out.sum()).backward()
    expected = x.detach().sum(0, keepdim=True).t().expand(4, 4) + 1
    assert torch.allclose(w.grad, expected)
    grad_ours = w.grad.clone()
    w.grad = None
    out, w_out = theirs(fn, x)
    (out.sum() + w_out.sum()).backward()
    assert torch.equal(grad_ours, w.grad)


def test_custom_autograd_function_inside():
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    _assert_matches_torch(lambda x: Square.apply(x).exp(), lambda: [torch.randn(6, requires_grad=True)])


def test_detached_tensor_inside():
    def fn(x):
        return x.sin() * x.detach().cos()

    _assert_matches_torch(fn, lambda: [torch.randn(6, requires_grad=True)])


def test_input_not_requiring_grad_with_parameters():
    lin = nn.Linear(8, 8)
    x = torch.randn(3, 8)
    ours(lin, x).sum().backward()
    got = lin.weight.grad.clone()
    lin.weight.grad = None
    lin(x).sum().backward()
    assert torch.equal(got, lin.weight.grad)


def test_autocast_cpu_replayed():
    lin = nn.Linear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)
    grads = []
    for checkpoint in (ours, theirs):
        lin.zero_grad()
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = checkpoint(lambda t: torch.relu(lin(t)), x)
        assert out.dtype == torch.bfloat16
        out.float().sum().backward()
        grads.append((x.grad, lin.weight.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_non_determinism_is_detected():
    calls = [0]

    def fn(x):
        calls[0] += 1
        return x.sin().cos() if calls[0] == 1 else x.sin()  # one saved tensor fewer in recompute

    x = torch.randn(5, requires_grad=True)
    with pytest.raises(CheckpointError, match="different number of tensors was saved"):
        ours(fn, x, early_stop=False).sum().backward()


def test_changed_metadata_is_detected_and_determinism_check_none_disables_it():
    def make(fn_holder):
        def fn(x):
            fn_holder[0] += 1
            y = x if fn_holder[0] == 1 else x.double()
            return y.sin().float()
        return fn

    x = torch.randn(5, requires_grad=True)
    with pytest.raises(CheckpointError, match="different metadata"):
        ours(make([0]), x).sum().backward()
    # determinism_check="none": no check, the recomputed (double) value is used, as in torch
    ours(make([0]), x, determinism_check="none").sum().backward()
    got = x.grad
    x.grad = None
    theirs(make([0]), x, determinism_check="none").sum().backward()
    assert torch.equal(got, x.grad)


def test_debug_prints_operator_traces():
    calls = [0]

    def fn(x):
        calls[0] += 1
        return x.sin() if calls[0] == 1 else x.sin().cos()

    x = torch.randn(5, requires_grad=True)
    with pytest.raises(CheckpointError, match="aten.sin"):
        ours(fn, x, debug=True, early_stop=False).sum().backward()


def test_set_checkpoint_early_stop_overrides():
    runs = []

    def fn(x):
        y = x.sin()
        runs.append(1)
        return y * 2

    x = torch.randn(3, requires_grad=True)
    with set_checkpoint_early_stop(False):
        ours(fn, x).sum().backward()
    assert len(runs) == 2
    runs.clear()
    ours(fn, x).sum().backward()
    assert len(runs) == 1


def test_saved_tensor_accessed_twice_without_recompute():
    class TwiceAccess(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            with pytest.raises(CheckpointError, match="already unpacked once"):
                ctx.saved_tensors
            return g * x.cos()

    x = torch.randn(4, requires_grad=True)
    ours(lambda t: TwiceAccess.apply(t * 1), x).sum().backward()
    assert torch.allclose(x.grad, x.detach().cos())


def test_retain_graph_backward_twice_recomputes_twice():
    runs = []

    def fn(x):
        runs.append(1)
        return x.sin().exp()

    x = torch.randn(4, requires_grad=True)
    out = ours(fn, x)
    out.sum().backward(retain_graph=True)
    first = x.grad.clone()
    out.sum().backward()
    assert torch.equal(x.grad, 2 * first) and len(runs) == 3


@pytest.fixture(params=["c", "python"])
def checkpoint_hooks(request, monkeypatch):
    """Runs a test with our non-reentrant checkpoint's C hooks (pyext/checkpoint_frame.cpp) and again
    with the Python path a build without them takes (torch's own implementation): the prefix of a
    CheckpointError says which one served."""
    import torch_offload.checkpointing.checkpoint as checkpoint_module
    from torch_offload.checkpointing import nonreentrant
    if request.param == "python":
        monkeypatch.setattr(checkpoint_module, "c_checkpoint_hooks_available", lambda: False)
        return "torch.utils.checkpoint:"
    if not nonreentrant.available():
        if os.environ.get("TORCH_OFFLOAD_PYTHON_SAVE_HOOKS") == "1":
            pytest.skip("TORCH_OFFLOAD_PYTHON_SAVE_HOOKS=1: the Python path only")
        pytest.fail("the C checkpoint hooks were not built or not found next to the library")
    return "torch_offload.checkpoint:"


@pytest.mark.parametrize("use_graph_execution_group", [True, False])
def test_checkpoint_graph_execution_group(checkpoint_hooks, use_graph_execution_group):
    counter = [0]

    def fn(x):
        counter[0] += 1
        y = x.sin().cos()
        z = y.sin().cos()
        return y, z

    x = torch.randn(3, 3, requires_grad=True)
    y, z = ours(fn, x)
    context = GraphExecGroup() if use_graph_execution_group else contextlib.nullcontext()
    with context:
        (grad_y,) = torch.autograd.grad(z, inputs=(y,), grad_outputs=(torch.ones(3, 3),))
        (grad_x,) = torch.autograd.grad(y, inputs=(x,), grad_outputs=(grad_y,))
    # The forward, then one recompute for the group, or one for each of the two backwards.
    assert counter[0] == (2 if use_graph_execution_group else 3)
    y_ref, z_ref = fn(x)
    expected = torch.autograd.grad(y_ref, x, torch.autograd.grad(z_ref, y_ref, torch.ones(3, 3))[0])[0]
    assert torch.equal(grad_x, expected)


def test_checkpoint_graph_execution_group_refuses_overlapping_backwards(checkpoint_hooks):
    # Not actually disjoint (retain_graph=True, or autograd itself would catch it): under the group
    # the two backwards share one recompute, whose tensors the first one used up.
    def fn(t):
        return t.sin().cos()

    x = torch.randn(3, 3, requires_grad=True)
    out = ours(fn, x)
    with GraphExecGroup():
        out.sum().backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="Performing two backward calls that overlap") as error:
            out.sum().backward()
    assert str(error.value).startswith(checkpoint_hooks)
    # Outside the group, the same second backward recomputes for itself.
    x.grad = None
    out.sum().backward()
    assert torch.equal(x.grad, torch.autograd.grad(fn(x).sum(), x)[0])
