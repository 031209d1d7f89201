"""disk_direct_io=True: the disk tier's files bypass the page cache (O_DIRECT). Training through it
gives plain training's gradients, nothing is read from the page cache, the option survives a copy
of the manager, and asking for it without a disk tier is a clear error. (The C++ tests cover
every tensor size around the 4096-byte block and a misaligned buffer.) disk_direct_io="auto": each
file decides by the host's available RAM; training through a mix of both kinds of file gives plain
training's gradients.)"""
import copy
import warnings

import pytest

import torch_offload
from python_tests.support.devices import DEVICES
from python_tests.support.llama import _steps_match_plain, _tiny_llama


def _direct_io_works(directory) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the refusal's warning is what this asks about
        manager = torch_offload.OffloadManager(disk_dir=str(directory), disk_only=True, disk_direct_io=True)
    return manager.stats()["disk_direct_io"] == 1


@pytest.fixture
def direct_io_dir(tmp_path):
    """tmp_path, where its filesystem does O_DIRECT (the test is skipped elsewhere)."""
    if not _direct_io_works(tmp_path):
        pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT")
    return tmp_path


@pytest.mark.parametrize("device", DEVICES)
def test_disk_mode_with_direct_io_matches_plain_training_around_the_page_cache(device, direct_io_dir):
    ours = _tiny_llama(device)
    plain = copy.deepcopy(ours)
    handle = torch_offload.apply(ours, mode="disk", min_bytes=0, disk_dir=str(direct_io_dir), disk_direct_io=True)
    _steps_match_plain(ours, plain, device, shape=(2, 40))
    stats = handle.stats()
    assert stats["disk_direct_io"] == 1
    assert stats["disk_bytes_written"] == stats["bytes_to_host"] > 0
    assert stats["disk_bytes_read"] > 0
    assert stats["disk_bytes_read_from_page_cache"] == 0
    assert stats["disk_files"] == 0 and stats["live_handles"] == 0


def test_hidden_states_through_a_direct_io_disk_tier_matches_plain_training(direct_io_dir):
    ours = _tiny_llama("cpu")
    plain = copy.deepcopy(ours)
    handle = torch_offload.apply(ours, mode="hidden_states", disk_dir=str(direct_io_dir), disk_only=True,
                                 disk_direct_io=True)
    _steps_match_plain(ours, plain, "cpu", shape=(2, 40))
    assert handle.stats()["disk_direct_io"] == 1


def test_the_option_survives_a_copy_of_the_manager(tmp_path):
    manager = torch_offload.OffloadManager(disk_dir=str(tmp_path), disk_only=True, disk_direct_io=True)
    assert manager.disk_direct_io()
    assert copy.deepcopy(manager).disk_direct_io()
    assert not copy.deepcopy(torch_offload.OffloadManager(disk_dir=str(tmp_path))).disk_direct_io()


def test_direct_io_without_a_disk_tier_is_a_clear_error():
    with pytest.raises(RuntimeError, match="disk_direct_io=True is for the disk tier"):
        torch_offload.OffloadManager(disk_direct_io=True)
    with pytest.raises(RuntimeError, match="disk_direct_io=True is for the disk tier"):
        torch_offload.apply(_tiny_llama("cpu"), mode="all", disk_direct_io=True)


@pytest.mark.parametrize("device", DEVICES)
def test_auto_direct_io_mixes_both_kinds_of_file_and_trains_like_plain(device, direct_io_dir):
    ours = _tiny_llama(device)
    plain = copy.deepcopy(ours)
    handle = torch_offload.apply(ours, mode="disk", min_bytes=0, disk_dir=str(direct_io_dir), disk_direct_io="auto")
    manager = handle.manager
    assert manager.disk_direct_io_auto() and not manager.disk_direct_io()
    manager._simulate_available_ram(1 << 40)  # plenty: the page cache
    _steps_match_plain(ours, plain, device, shape=(2, 40), steps=1)
    stats = handle.stats()
    assert stats["disk_direct_io"] == 2 and stats["disk_bytes_written"] > 0
    assert stats["disk_bytes_written_direct"] == 0
    manager._simulate_available_ram(0)  # short: every new file goes around it
    _steps_match_plain(ours, plain, device, shape=(2, 40), steps=1)
    stats = handle.stats()
    assert 0 < stats["disk_bytes_written_direct"] < stats["disk_bytes_written"]
    assert stats["disk_files"] == 0 and stats["live_handles"] == 0


def test_auto_survives_a_copy_and_bad_values_are_named(tmp_path):
    manager = torch_offload.OffloadManager(disk_dir=str(tmp_path), disk_only=True, disk_direct_io="auto")
    copied = copy.deepcopy(manager)
    assert copied.disk_direct_io_auto() and not copied.disk_direct_io()
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match=f"disk_direct_io={bad!r}; expected True, False or 'auto'"):
            torch_offload.OffloadManager(disk_dir=str(tmp_path), disk_direct_io=bad)
    with pytest.raises(RuntimeError, match="disk_direct_io='auto' is for the disk tier"):
        torch_offload.OffloadManager(disk_direct_io="auto")
