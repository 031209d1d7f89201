"""torch_offload.OffloadManager is one thing: the TorchScript class, built with keyword options and
recognised by isinstance() however an instance was made."""
import copy

import torch

import torch_offload


def test_offload_manager_builds_and_recognises_the_torchscript_class():
    manager = torch_offload.OffloadManager(max_in_flight=2, prefetch_depth=3)
    assert type(manager) is torch.ScriptObject and (manager.max_in_flight(), manager.prefetch_depth()) == (2, 3)
    for made in (manager, torch.classes.offload.OffloadManager(), copy.deepcopy(manager),
                 torch_offload.default_manager()):
        assert isinstance(made, torch_offload.OffloadManager)
    for other in (object(), torch.ones(1), torch_offload.OffloadManager, None):
        assert not isinstance(other, torch_offload.OffloadManager)
