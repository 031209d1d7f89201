"""What the selective tests share: a block with one attention call (AttentionBlock), and the matrix
products a tiny Llama step's backward runs under apply(mode="selective") (matmuls_in_backward)."""
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import torch_offload
from python_tests.support.llama import _tiny_llama

LAYERS, BATCH, SEQ = 3, 2, 32


class AttentionBlock(nn.Module):
    def __init__(self, width=32, heads=4, dropout=0.0):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Dropout(dropout), nn.Linear(2 * width, width))
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attn.transpose(1, 2).reshape(b, s, w))
        return x + self.mlp(x)


class _CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        return func(*args, **(kwargs or {}))


def matmuls_in_backward(use_reentrant=False, **options):
    """A tiny Llama step under apply(mode="selective", **options): (matrix products in backward,
    bytes copied to the host)."""
    model = _tiny_llama("cpu", 0.0)
    handle = torch_offload.apply(model, "selective", model.model.layers, min_bytes=0,
                                 use_reentrant=use_reentrant, **options)
    ids = torch.randint(0, 256, (BATCH, SEQ))
    loss = model(input_ids=ids, labels=ids).loss
    with _CountMatmuls() as counter:
        loss.backward()
    copied = handle.stats()["bytes_to_host"]
    handle.remove()
    return counter.count, copied
