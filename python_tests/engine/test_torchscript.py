"""TorchScript: an OffloadManager attribute in a scripted module whose forward offloads long-lived
skip tensors after the encoder and restores them before the decoder; saved with torch.jit.save,
loaded in a fresh process (Python, and a C++ program through torch::jit::load)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import torch_offload
from python_tests.support.devices import DEVICES

ROWS, COLS = 8, 16
RUN_SCRIPTED = Path(__file__).resolve().parents[2] / "build" / "examples" / "cpp" / "run_scripted"


class SkipEncoderDecoder(nn.Module):
    """A U-Net-like stack: the encoder's activations wait for the decoder in host memory."""

    def __init__(self, manager):
        super().__init__()
        self.manager = manager
        self.enc1 = nn.Linear(COLS, 32)
        self.enc2 = nn.Linear(32, 32)
        self.mid = nn.Linear(32, 32)
        self.dec2 = nn.Linear(32, 32)
        self.dec1 = nn.Linear(32, COLS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        manager_id = self.manager.id()
        skip1 = torch.relu(self.enc1(x))
        skip2 = torch.relu(self.enc2(skip1))
        held1 = torch.ops.offload.offload_save(skip1, manager_id)
        held2 = torch.ops.offload.offload_save(skip2, manager_id)
        h = torch.relu(self.mid(skip2))
        h = torch.relu(self.dec2(h)) + torch.ops.offload.offload_restore(held2, x.device, manager_id)
        return self.dec1(h + torch.ops.offload.offload_restore(held1, x.device, manager_id))


def _input():
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS) / (ROWS * COLS)


@pytest.fixture
def scripted_file(tmp_path):
    torch.manual_seed(0)
    model = SkipEncoderDecoder(torch_offload.OffloadManager(max_in_flight=2))
    scripted = torch.jit.script(model)
    path = tmp_path / "skip_model.pt"
    torch.jit.save(scripted, str(path))
    return path, scripted, model


def _env():
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


@pytest.mark.parametrize("device", DEVICES)
def test_scripted_model_offloads_and_trains(device):
    torch.manual_seed(0)
    model = SkipEncoderDecoder(torch_offload.OffloadManager()).to(device)
    scripted = torch.jit.script(model)
    x = _input().to(device)
    out = scripted(x)
    torch.testing.assert_close(out, model(x), rtol=0, atol=0)
    out.square().sum().backward()  # the ops' autograd (C++) routes gradients through the copies
    scripted_grads = [p.grad.clone() for p in scripted.parameters()]
    # The same computation without offloading (the ops are copies: gradients must agree).
    model.zero_grad()
    skip1 = torch.relu(model.enc1(x))
    skip2 = torch.relu(model.enc2(skip1))
    h = torch.relu(model.dec2(torch.relu(model.mid(skip2)))) + skip2
    model.dec1(h + skip1).square().sum().backward()
    for a, p in zip(scripted_grads, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-6, atol=1e-7)
    assert scripted.manager.stats()["bytes_to_host"] == 2 * 2 * ROWS * 32 * 4


def test_saved_file_runs_in_a_fresh_python_process(scripted_file, tmp_path):
    path, scripted, _ = scripted_file
    expected = scripted(_input())
    code = textwrap.dedent(f"""
        import torch, torch_offload
        model = torch.jit.load({str(path)!r})
        x = torch.arange({ROWS * COLS}, dtype=torch.float32).reshape({ROWS}, {COLS}) / {ROWS * COLS}
        torch.save(model(x), {str(tmp_path / 'out.pt')!r})
        print("bytes_to_host", int(model.manager.stats()["bytes_to_host"]))
        print("max_in_flight", model.manager.max_in_flight())
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(),
                            cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"bytes_to_host {2 * ROWS * 32 * 4}" in result.stdout
    assert "max_in_flight 2" in result.stdout  # the configuration travelled through def_pickle
    assert torch.equal(torch.load(tmp_path / "out.pt"), expected)


def test_saved_file_runs_from_a_cpp_program(scripted_file):
    if not RUN_SCRIPTED.exists():
        pytest.skip(f"{RUN_SCRIPTED} not built (scripts/build.sh builds it)")
    path, scripted, _ = scripted_file
    expected = scripted(_input()).sum().item()
    result = subprocess.run([str(RUN_SCRIPTED), str(path), str(ROWS), str(COLS)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split() for line in result.stdout.splitlines())
    assert float(lines["sum"]) == pytest.approx(expected, rel=1e-6)
    assert lines["bytes_to_host"] == str(2 * ROWS * 32 * 4)


def test_cpp_training_example_runs():
    binary = RUN_SCRIPTED.parent / "train_offload"
    if not binary.exists():
        pytest.skip(f"{binary} not built (scripts/build.sh builds it)")
    result = subprocess.run([str(binary), "2"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "offloaded 12 tensors" in result.stdout


def test_cpp_example_reports_a_missing_file_and_exits_nonzero(tmp_path):
    if not RUN_SCRIPTED.exists():
        pytest.skip(f"{RUN_SCRIPTED} not built (scripts/build.sh builds it)")
    missing = tmp_path / "missing.pt"
    result = subprocess.run([str(RUN_SCRIPTED), str(missing), "8", "16"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1, result.stderr  # not an abort (-6) from an uncaught c10::Error
    assert "run_scripted" in result.stderr and "missing.pt" in result.stderr
