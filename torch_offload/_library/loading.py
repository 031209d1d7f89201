"""Finds and loads libtorch_offload, which registers torch.ops.offload.* and torch.classes.offload.*."""
import importlib.machinery
import importlib.util
import mmap
import os
from pathlib import Path

import torch

_LIBRARY_NAME = "libtorch_offload.so"
_loaded_path = None


def _candidates():
    explicit = os.environ.get("TORCH_OFFLOAD_LIBRARY")
    if explicit:
        yield Path(explicit)
        return
    package_dir = Path(__file__).resolve().parents[1]  # torch_offload/
    yield package_dir / _LIBRARY_NAME  # pip install .
    yield package_dir.parent / "build" / _LIBRARY_NAME  # CMake build of a source checkout


_RECORD_PREFIX = b"torch_offload build record: "


def build_record(path):
    """The build record compiled into the library at `path` (torch_library/build_record.cpp), read
    from the file without loading it: {"torch": torch.__version__ it was built against,
    "cuda_runtime": "toolkit", "pip" or "none" (CPU kernels only)}; None for a library without one."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        start = data.find(_RECORD_PREFIX)
        if start < 0:
            return None
        end = data.find(b"\0", start)
        text = data[start + len(_RECORD_PREFIX):end].decode("utf-8", "replace")
    return dict(item.split("=", 1) for item in text.split(";") if "=" in item)


def _check_torch(path):
    """Refuses a library built against another torch than the one imported: torch::class_ is not in
    torch's stable ABI, so such a library fails to load or misbehaves."""
    record = build_record(path)
    built = record.get("torch") if record else None
    if built and built != torch.__version__:
        raise ImportError(
            f"torch_offload: {path} was built against torch {built}, but this process runs torch "
            f"{torch.__version__}. The library must be built against the exact torch it runs with: "
            "rebuild it in this environment (pip install --no-build-isolation . from the source "
            "tree, or scripts/build.sh for build/), or install the torch it was built for."
        )


def load_library():
    """Loads the C++ library once and returns its path."""
    global _loaded_path
    if _loaded_path is None:
        tried = []
        for path in _candidates():
            tried.append(str(path))
            if path.is_file():
                _check_torch(path)
                torch.ops.load_library(str(path))
                _loaded_path = str(path)
                break
        else:
            raise ImportError(
                "torch_offload: could not find " + _LIBRARY_NAME + " (looked at " + ", ".join(tried)
                + "). Install the package with `pip install .`, build it with CMake into build/, "
                "or set TORCH_OFFLOAD_LIBRARY to the library's path."
            )
    return _loaded_path


_SAVE_HOOKS_NAME = "_save_hooks"
_save_hooks = False  # not looked for yet


def load_save_hooks():
    """The C save hooks (pyext/save_hooks.cpp) built for this Python, from the directory the library
    was loaded from; None where they were not built (no Python headers at build time), or with
    TORCH_OFFLOAD_PYTHON_SAVE_HOOKS=1 (the Python hooks, for comparison and debugging)."""
    global _save_hooks
    if _save_hooks is False:
        _save_hooks = None
        if os.environ.get("TORCH_OFFLOAD_PYTHON_SAVE_HOOKS", "0") != "1":
            directory = Path(load_library()).parent
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = directory / (_SAVE_HOOKS_NAME + suffix)
                if path.is_file():
                    spec = importlib.util.spec_from_file_location("torch_offload." + _SAVE_HOOKS_NAME, path)
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    _save_hooks = module
                    break
    return _save_hooks
