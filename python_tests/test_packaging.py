"""The library loads both ways users reach it: the pip-installed package, and a plain script that
calls torch.ops.load_library itself without the Python package."""
import os
import subprocess
import sys
import textwrap

import pytest

import torch_offload


def _run(code, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCH_OFFLOAD_LIBRARY")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_plain_script_uses_the_ops_through_load_library(tmp_path):
    result = _run(f"""
        import torch
        torch.ops.load_library({torch_offload.library_path!r})
        manager = torch.classes.offload.OffloadManager(2, 1, 0)
        x = torch.randn(100)
        handle = torch.ops.offload.offload_save(x, manager.id())
        y = torch.ops.offload.offload_restore(handle, torch.device("cpu"), manager.id())
        assert torch.equal(x, y)
        print("bytes_to_host", int(manager.stats()["bytes_to_host"]))
        """, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "bytes_to_host 400" in result.stdout


def test_pip_installed_package_carries_its_library(tmp_path):
    # Run from an empty directory so that the installed package, not this checkout, is imported.
    probe = _run("import importlib.util; print(importlib.util.find_spec('torch_offload') is not None)",
                 cwd=tmp_path)
    if probe.stdout.strip() != "True":
        pytest.skip("torch_offload is not pip-installed here (scripts/test.sh installs it)")
    result = _run("""
        import torch, torch_offload
        assert "site-packages" in torch_offload.library_path, torch_offload.library_path
        x = torch.randn(10, requires_grad=True)
        y = torch_offload.checkpoint(lambda t: t.sin() * 2, x)
        y.sum().backward()
        assert torch.equal(x.grad, 2 * x.detach().cos())
        from torch_offload._engine import library as _library
        assert _library.load_save_hooks() is not None, "the C save hooks are not in the package"
        print("ok", torch_offload.library_path)
        """, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")
