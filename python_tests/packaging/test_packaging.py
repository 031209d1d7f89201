"""The library loads both ways users reach it: the pip-installed package, and a plain script that
calls torch.ops.load_library itself without the Python package. The distribution: a core that needs
torch only, the license in the metadata, pinned requirement files, a version that names the torch
built against, and an import that refuses any other torch."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torch_offload
from python_tests.support.distribution import OPTIONAL, ROOT, TRAIN_ONE_STEP


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
        from torch_offload._library import loading as _library
        assert _library.load_save_hooks() is not None, "the C save hooks are not in the package"
        print("ok", torch_offload.library_path)
        """, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


# --- Distribution: metadata, license, requirements, and the torch the library was built against. ---


def _pyproject():
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_core_requires_torch_only():
    from packaging.requirements import Requirement

    project = _pyproject()["project"]
    assert [Requirement(r).name for r in project["dependencies"]] == ["torch"]
    extras = project["optional-dependencies"]
    assert {"hf", "trl", "lightning", "bench", "test", "examples"} <= set(extras)
    assert all("lightning" in {Requirement(r).name for r in extras[extra]} for extra in ("lightning", "test"))
    assert "diffusers==0.42.1" in extras["examples"]
    assert "transformers" in {Requirement(r).name for r in extras["hf"]}
    assert "matplotlib" in {Requirement(r).name for r in extras["bench"]}
    assert "torch" not in " ".join(_pyproject()["build-system"]["requires"])  # built against the env's torch


def test_the_package_imports_and_trains_without_the_optional_packages(tmp_path):
    # Each optional package is made unimportable (a None entry in sys.modules raises ImportError).
    result = _run(f"import sys\nfor name in {OPTIONAL!r}: sys.modules[name] = None\n"
                  + textwrap.dedent(TRAIN_ONE_STEP), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "trained" in result.stdout


def test_license_is_bsd_3_clause_and_named_in_the_metadata():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("BSD 3-Clause License")
    assert "Copyright (c) 2026, the torch_offload authors" in text
    project = _pyproject()["project"]
    assert project["license"] == "BSD-3-Clause"
    assert project["license-files"] == ["LICENSE"]


def test_requirement_files_are_pinned():
    for path in sorted((ROOT / "requirements").glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split("#")[0].strip()
            if line and not line.startswith("-r "):
                assert "==" in line, f"{path.name}: {line} is not pinned"
    demo = (ROOT / "requirements" / "demo.txt").read_text(encoding="utf-8")
    assert "torch==" in demo and "transformers==" in demo and "pytest" not in demo


def _version_provider():
    sys.path.insert(0, str(ROOT / "build_support"))
    try:
        import torch_offload_version
    finally:
        sys.path.pop(0)
    return torch_offload_version


def test_the_version_names_the_torch_built_against():
    import torch
    from packaging.version import Version

    provider = _version_provider()
    settings = _pyproject()["tool"]["scikit-build"]["metadata"]["version"]
    version = Version(provider.dynamic_metadata("version", {"base": settings["base"]}))
    assert str(version.public) == "0.2.0"
    assert version.local == provider.local_label(torch.__version__).lower()
    assert provider.local_label("2.11.0+cu130") == "torch2.11.0.cu130"


def test_installed_metadata(tmp_path):
    # The metadata scikit-build-core wrote for the pip-installed package (scripts/test.sh installs it).
    probe = _run("""
        import importlib.metadata as m
        meta = m.metadata("torch_offload")
        print(meta["Version"]); print(meta.get("License-Expression")); print(meta.get_all("License-File"))
        print([r for r in m.requires("torch_offload") if "extra ==" not in r])
        """, cwd=tmp_path)
    if probe.returncode != 0:
        pytest.skip("torch_offload is not pip-installed here (scripts/test.sh installs it)")
    import torch

    version, license_expression, license_files, requires = probe.stdout.splitlines()
    assert version == "0.2.0+" + _version_provider().local_label(torch.__version__)
    assert license_expression == "BSD-3-Clause"
    assert license_files == "['LICENSE']"
    assert requires == "['torch>=2.11']"


def test_the_library_records_the_torch_it_was_built_against():
    import torch
    from torch_offload._library.loading import build_record

    record = build_record(torch_offload.library_path)
    assert record is not None, f"{torch_offload.library_path} has no build record"
    assert record["torch"] == torch.__version__
    assert record["cuda_runtime"] in ("toolkit", "pip", "none")


def test_import_refuses_a_library_built_against_another_torch(tmp_path):
    import re

    import torch

    data = Path(torch_offload.library_path).read_bytes()
    built = ("torch_offload build record: torch=" + torch.__version__ + ";").encode()
    assert data.count(built) == 1
    other = re.sub(r"\d", "9", torch.__version__)
    other = other if other != torch.__version__ else re.sub(r"\d", "8", torch.__version__)
    library = tmp_path / "libtorch_offload.so"  # same length: the file stays a valid library
    library.write_bytes(data.replace(built, built.replace(torch.__version__.encode(), other.encode())))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TORCH_OFFLOAD_LIBRARY"] = str(library)
    result = subprocess.run([sys.executable, "-c", "import torch_offload"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: torch_offload: "), result.stderr
    assert f"built against torch {other}, but this process runs torch {torch.__version__}" in message
    assert str(library) in message and "pip install --no-build-isolation ." in message
