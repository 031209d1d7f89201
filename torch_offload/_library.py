"""Finds and loads libtorch_offload, which registers torch.ops.offload.* and torch.classes.offload.*."""
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
    package_dir = Path(__file__).resolve().parent
    yield package_dir / _LIBRARY_NAME  # pip install .
    yield package_dir.parent / "build" / _LIBRARY_NAME  # CMake build of a source checkout


def load_library():
    """Loads the C++ library once and returns its path."""
    global _loaded_path
    if _loaded_path is None:
        tried = []
        for path in _candidates():
            tried.append(str(path))
            if path.is_file():
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
