"""Named policies with projection groups in compiled graphs (compile_policies.py): the projections'
products saved and offloaded (or kept) instead of recomputed, gradients bit-equal to eager
checkpointing, and the policies that cannot be told apart by shape refused."""
import copy

import pytest
import torch
from torch import nn

import torch_offload
from python_tests.support.compiled_graphs import BOUNDARY_BYTES, _check_graphs, _targets, _two_steps_bit_equal
from python_tests.support.llama import _tiny_llama

# Every test here starts from a fresh dynamo with the compile caches off (conftest.fresh_dynamo).
pytestmark = pytest.mark.usefixtures("fresh_dynamo")

_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


def _compiled(policy, base):
    return torch_offload.compile(copy.deepcopy(base), "selective", policy=policy, min_bytes=BOUNDARY_BYTES // 2,
                                 fullgraph=True, backend="aot_eager")


def _backward_matmuls(compiled) -> int:
    return sum(t in _MATMULS for t in _targets(compiled.offload_partitioner.graphs[0][1]))


def test_compiled_projection_groups_offload_their_products_bit_for_bit():
    base = _tiny_llama("cpu", dropout=0.0)
    eager = copy.deepcopy(base)
    eager.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    attention = _compiled("attention", base)
    projections = _compiled("attention+qkv+out_proj", base)
    _two_steps_bit_equal(eager, attention, "cpu")
    _two_steps_bit_equal(eager, projections, "cpu")
    _check_graphs(projections.offload_partitioner)
    # Per layer: the input, the attention output, and the q, k, v and o products (k and v are half
    # the width, at the size threshold).
    assert len(projections.offload_partitioner.offloaded[0]) == 3 * 6
    assert len(attention.offload_partitioner.offloaded[0]) == 3 * 2
    # The backward graph computes 4 fewer products per layer than under "attention".
    assert _backward_matmuls(attention) - _backward_matmuls(projections) == 3 * 4


def test_compiled_kept_group_keeps_its_products_on_the_device():
    base = _tiny_llama("cpu", dropout=0.0)
    eager = copy.deepcopy(base)
    eager.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    kept = _compiled("attention+keep_fc1", base)
    _two_steps_bit_equal(eager, kept, "cpu")
    attention = _compiled("attention", base)
    _two_steps_bit_equal(eager, attention, "cpu")
    # The same values offloaded as under "attention"; the up/gate products are not recomputed.
    assert len(kept.offload_partitioner.offloaded[0]) == len(attention.offload_partitioner.offloaded[0])
    assert _backward_matmuls(attention) - _backward_matmuls(kept) == 3 * 2


def test_projections_that_share_a_shape_with_another_linear_are_refused():
    # Llama's q_proj and o_proj are both hidden x hidden: "qkv" alone cannot be told from o_proj.
    with pytest.raises(ValueError, match=r"recognised by its weight's shape.*self_attn.o_proj \(64, 64\)"):
        torch_offload.compile(_tiny_llama("cpu", dropout=0.0), "selective", policy="attention+qkv",
                              backend="aot_eager")
    with pytest.raises(ValueError, match=r"an offloaded and a kept group share the shape \(64, 64\)"):
        torch_offload.compile(_tiny_llama("cpu", dropout=0.0), "selective", policy="attention+qkv+keep_out_proj",
                              backend="aot_eager")
    with pytest.raises(ValueError, match="has no Linear modules in module preset 'qkv'"):
        torch_offload.compile(nn.Linear(2, 2), "selective", policy="attention_qkv", blocks=[nn.Linear(2, 2)])
