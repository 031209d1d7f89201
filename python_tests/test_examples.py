"""The examples run as users run them (CPU here; the GPU machine runs them on CUDA)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_lora_layer_offload_example(device):
    pytest.importorskip("peft")
    if device == "cuda":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, str(REPO / "examples" / "lora_layer_offload.py"), "--device", device],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "layer offloading:" in run.stdout and "prefetched restores" in run.stdout, run.stdout


def test_hf_trainer_example():
    pytest.importorskip("transformers")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, str(REPO / "examples" / "hf_trainer.py"), "--device", "cpu"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "offloading (hidden_states): losses" in run.stdout and " saves" in run.stdout, run.stdout
