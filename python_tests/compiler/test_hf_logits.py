"""detach_logits (hf_logits.py): a compiled Hugging Face model called with labels returns its logits
detached inside the graph, so the compiled backward takes no zero gradient of their size; the
loss and every parameter gradient stay those of eager checkpointing."""
import copy

import pytest
import torch
from torch import nn

import torch_offload
from python_tests.support.compiled_graphs import _grads
from python_tests.support.llama import _tiny_llama

# Every test here starts from a fresh dynamo with the compile caches off (conftest.fresh_dynamo).
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _tangents(compiled):
    _, bwd = compiled.offload_partitioner.graphs[0]
    return [n.name for n in bwd.graph.nodes if n.op == "placeholder" and n.name.startswith("tangents")]


def test_detached_logits_leave_the_backward_one_gradient_input_and_the_same_gradients():
    base = _tiny_llama("cpu", dropout=0.0)
    eager = copy.deepcopy(base)
    eager.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    plain = torch_offload.compile(copy.deepcopy(base), "hidden_states", backend="aot_eager", fullgraph=True)
    detached = torch_offload.compile(copy.deepcopy(base), "hidden_states", backend="aot_eager", fullgraph=True,
                                     detach_logits=True)
    ids = torch.randint(0, 256, (2, 32))
    loss_e, grads_e = _grads(eager, ids, "cpu")
    loss_d, grads_d = _grads(detached, ids, "cpu")
    _grads(plain, ids, "cpu")
    assert torch.equal(loss_e, loss_d) and all(torch.equal(a, b) for a, b in zip(grads_e, grads_d))
    assert len(_tangents(plain)) == 2  # the loss's gradient and the logits' (zeros)
    assert len(_tangents(detached)) == 1
    out = detached(input_ids=ids, labels=ids)
    assert out.loss.requires_grad and not out.logits.requires_grad


def test_calls_without_labels_keep_their_logits_differentiable():
    model = torch_offload.detach_logits(_tiny_llama("cpu", dropout=0.0))
    assert torch_offload.detach_logits(model) is model  # once is enough
    ids = torch.randint(0, 256, (2, 16))
    logits = model(input_ids=ids).logits
    assert logits.requires_grad
    logits.float().square().mean().backward()  # a loss of the user's own, through the logits
    assert model.model.embed_tokens.weight.grad is not None
    copied = copy.deepcopy(model)  # the wrapper follows the copy, not the original
    assert copied.forward.block is copied


def test_detach_logits_refuses_a_model_it_cannot_serve():
    with pytest.raises(ValueError, match="expected a Hugging Face causal LM.*Linear"):
        torch_offload.detach_logits(nn.Linear(2, 2))
