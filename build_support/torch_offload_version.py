"""scikit-build-core metadata provider for the package's version (pyproject.toml,
[tool.scikit-build.metadata.version]): the base version with the torch the wheel is built against as
its local label, 0.2.0+torch2.11.0.cu130 for torch 2.11.0+cu130. The library runs only with that
exact torch (torch_offload/_library/loading.py refuses any other), so the wheel's name says which.

The torch is the one of the Python running the build (pip install --no-build-isolation .), the one
CMake builds against (cmake/torch_and_cuda.cmake); its version is read from torch/version.py without
importing torch."""
import importlib.util
import re
from pathlib import Path


def torch_version():
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "torch_offload is built against the torch installed where it is built, and this Python has "
            "none: install torch, then run `pip install --no-build-isolation .` (an isolated build does "
            "not see the environment's torch)."
        )
    text = (Path(spec.origin).parent / "version.py").read_text(encoding="utf-8")
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    if match is None:
        raise RuntimeError(f"torch_offload: no __version__ in {Path(spec.origin).parent / 'version.py'}")
    return match.group(1)


def local_label(version):
    """A PEP 440 local label naming a torch version: 2.11.0+cu130 -> torch2.11.0.cu130."""
    return "torch" + re.sub(r"[^A-Za-z0-9]+", ".", version).strip(".")


def dynamic_metadata(field, settings, project=None):
    if field != "version":
        raise RuntimeError(f"torch_offload_version provides the version only, not {field!r}")
    base = settings.get("base")
    if not isinstance(base, str) or "+" in base:
        raise RuntimeError("torch_offload_version needs base = \"X.Y.Z\" (without a local label)")
    return f"{base}+{local_label(torch_version())}"
