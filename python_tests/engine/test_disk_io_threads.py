"""disk_io_threads: the disk tier's IO threads, one write in flight each. Training through more or
fewer of them gives plain training's gradients; the option reaches the manager from every front
door and survives a copy of it; a wrong value, or the option without a disk tier, is an error that
names it. (The C++ tests show that a save waits once every thread has a write under way, whatever
max_in_flight allows the device copies.)"""
import copy

import pytest

import torch_offload
from torch_offload._library.manager import MANAGER_DEFAULTS
from python_tests.support.devices import DEVICES
from python_tests.support.llama import _steps_match_plain, _tiny_llama


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("threads", [1, 8])
def test_disk_mode_with_more_or_fewer_io_threads_matches_plain_training(device, threads, tmp_path):
    ours = _tiny_llama(device)
    plain = copy.deepcopy(ours)
    handle = torch_offload.apply(ours, mode="disk", min_bytes=0, disk_dir=str(tmp_path), disk_io_threads=threads)
    assert handle.manager.disk_io_threads() == threads
    _steps_match_plain(ours, plain, device, shape=(2, 40))
    stats = handle.stats()
    assert stats["disk_bytes_written"] == stats["bytes_to_host"] > 0
    assert stats["disk_files"] == 0 and stats["live_handles"] == 0


def test_hidden_states_on_disk_takes_the_option(tmp_path):
    ours = _tiny_llama("cpu")
    plain = copy.deepcopy(ours)
    handle = torch_offload.apply(ours, mode="hidden_states", disk_dir=str(tmp_path), disk_only=True,
                                 disk_io_threads=2)
    assert handle.manager.disk_io_threads() == 2
    _steps_match_plain(ours, plain, "cpu", shape=(2, 40))
    assert handle.stats()["disk_bytes_written"] > 0


def test_the_default_is_the_engines_and_the_option_survives_a_copy(tmp_path):
    assert MANAGER_DEFAULTS.disk_io_threads == 4
    assert torch_offload.OffloadManager().disk_io_threads() == MANAGER_DEFAULTS.disk_io_threads
    assert torch_offload.DiskOptions().disk_io_threads == MANAGER_DEFAULTS.disk_io_threads
    manager = torch_offload.OffloadManager(disk_dir=str(tmp_path), disk_only=True, disk_io_threads=6)
    assert copy.deepcopy(manager).disk_io_threads() == 6
    with torch_offload.offload_activations("disk", disk_dir=str(tmp_path), disk_io_threads=3) as hooks:
        assert hooks.manager.disk_io_threads() == 3


def test_wrong_values_and_a_missing_disk_tier_are_named(tmp_path):
    model = _tiny_llama("cpu")
    with pytest.raises(ValueError, match=r"disk_io_threads=0; expected an int >= 1"):
        torch_offload.apply(model, mode="disk", disk_dir=str(tmp_path), disk_io_threads=0)
    with pytest.raises(TypeError, match=r"disk_io_threads='8'; expected an int >= 1"):
        torch_offload.apply(model, mode="disk", disk_dir=str(tmp_path), disk_io_threads="8")
    with pytest.raises(RuntimeError, match="disk_io_threads=8 is for the disk tier"):
        torch_offload.apply(model, mode="all", disk_io_threads=8)
    with pytest.raises(RuntimeError, match="disk_io_threads must be 1 to 256, got 0"):
        torch_offload.OffloadManager(disk_dir=str(tmp_path), disk_io_threads=0)
