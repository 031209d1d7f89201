"""What the packaging tests share: the repository's root, a training step to run where the package
is installed, and the optional packages a core install goes without."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
# A training step of a tiny model of blocks under apply(..., "hidden_states"), checked against the
# same step without offloading; run by test_packaging.py and test_build_without_cuda_toolkit.py.
TRAIN_ONE_STEP = """
    import copy
    import torch, torch_offload
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(64, 128), nn.Linear(128, 64)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(3)])
    plain = copy.deepcopy(model)
    handle = torch_offload.apply(model, "hidden_states", blocks=list(model))
    x = torch.randn(4, 512, 64)
    for m in (model, plain):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
        m(x).square().mean().backward()
        optimizer.step()
    for a, b in zip(model.parameters(), plain.parameters()):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
    stats = handle.stats()
    assert stats["bytes_to_host"] > 0, stats
    handle.remove()
    print("trained", stats["bytes_to_host"])
    """
OPTIONAL = ("transformers", "trl", "peft", "accelerate", "diffusers", "datasets", "matplotlib", "lightning")
