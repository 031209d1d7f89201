"""The block stacks the checkpoint tests train through our checkpoint and torch's (two copies of one
stack and its input: _pair; a stack through a wrapper, seeded: _run)."""
import copy

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width=32, dropout=0.2):
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(width)

    def forward(self, x, scale=1.0, *, bias=None, extra=None):
        h = self.fc2(self.drop(torch.relu(self.fc1(self.norm(x)))))
        if bias is not None:
            h = h + bias
        if extra is not None:
            h = h * extra["gate"]
        return x + scale * h


def _run(blocks, x, wrap, **kwargs):
    torch.manual_seed(1234)
    h = x
    for block in blocks:
        h = wrap(block, h, **kwargs)
    loss = h.square().mean()
    loss.backward()
    return loss


def _pair(device, n=3, dropout=0.2):
    torch.manual_seed(0)
    a = nn.ModuleList(Block(dropout=dropout) for _ in range(n)).to(device)
    b = copy.deepcopy(a)
    x = torch.randn(4, 16, 32, device=device)
    return a, b, x
