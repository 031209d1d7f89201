"""What the compiler tests check of a compiled model: our ops in its forward and backward graphs,
and two training steps bit-equal to eager with no graph break."""
import torch
import torch._dynamo

import torch_offload  # noqa: F401  (registers torch.ops.offload)
from python_tests.support.llama import _deterministic_attention

# One layer boundary of the tiny Llama at batch 2 x 32 tokens (fp32): as min_bytes ("all",
# "selective"), the size threshold that keeps smaller saved values (a logsumexp) resident.
BOUNDARY_BYTES = 2 * 32 * 64 * 4
_SAVE = torch.ops.offload.offload_save.default
_RESTORE = torch.ops.offload.offload_restore.default


def _grads(model, ids, device):
    model.zero_grad(set_to_none=True)
    with _deterministic_attention(device):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _two_steps_bit_equal(eager, compiled, device):
    """Two training steps of each: losses and gradients equal bit for bit, no graph break."""
    ids = torch.randint(0, 256, (2, 32), device=device)
    for _ in range(2):
        loss_e, grads_e = _grads(eager, ids, device)
        loss_c, grads_c = _grads(compiled, ids, device)
        assert torch.equal(loss_e, loss_c)
        assert all(torch.equal(a, b) for a, b in zip(grads_e, grads_c))
    assert not torch._dynamo.utils.counters["graph_break"]


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _check_graphs(partitioner, expect_boundaries=None, also=()):
    """Every graph saves and restores what it offloads; with expect_boundaries, it offloads that many
    layer inputs and, besides them, exactly the values named in `also`."""
    assert partitioner.graphs, "the partitioner never ran"
    for (fwd, bwd), names in zip(partitioner.graphs, partitioner.offloaded):
        assert _targets(fwd).count(_SAVE) == len(names) > 0
        assert _targets(bwd).count(_RESTORE) == len(names)
        assert _SAVE not in _targets(bwd) and _RESTORE not in _targets(fwd)
        if expect_boundaries is not None:
            assert sorted(set(names) & set(also)) == sorted(also), names
            assert len(set(names) - set(also)) == expect_boundaries, names
