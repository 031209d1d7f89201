"""The package builds where no CUDA toolkit is installed, against a PyPI torch, and works: a wheel
built with pip (--no-build-isolation, as a user builds it) with the toolkit hidden, installed into
a fresh virtual environment that has torch but none of the optional packages, imported there, and
one training step run on CPU, then the engine's and the modes' CPU tests against that library. Its
CUDA runtime then comes from NVIDIA's pip packages beside torch (cmake/torch_and_cuda.cmake). Also: CMake's configure prints no warnings, and
-DTORCH_OFFLOAD_CUDA=OFF builds the CPU kernels only.

Hiding the toolkit: PATH without the directories that hold nvcc, no CUDA_HOME / CUDA_PATH, and
CUDAToolkit_ROOT naming a directory that does not exist, as on a machine without one; CMake's
FindCUDAToolkit also looks in /usr/local/cuda and the system prefixes whatever the environment says,
so the build is also given -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON. The fresh venv sees the
test venv's packages, torch among them (nothing is downloaded), through a .pth file naming a
directory of links to them, without transformers, TRL, PEFT, accelerate, diffusers, datasets,
matplotlib and the installed torch_offload."""
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from python_tests.support.distribution import OPTIONAL, ROOT, TRAIN_ONE_STEP
from python_tests.support.fresh_venv import _run, _shared_site

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
# The CPU tests run again against the build without a toolkit: the engine's ops, the checkpoints
# (torch's own test suite among them), every activation mode, layer offloading, long context.
CPU_SUITE = ("engine/test_ops.py", "engine/test_op_errors.py", "modes/test_options.py",
             "hooks/test_nothing_offloaded.py", "apply/test_remove.py", "checkpointing/test_block_input.py",
             "checkpointing/test_checkpoint.py", "checkpointing/test_checkpoint_torch_suite.py",
             "hooks/test_offload_hooks.py", "policies/test_selective.py", "layers/test_layers.py",
             "apply/test_long_context.py")
_HIDDEN = ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDACXX", "CUDAToolkit_ROOT", "PYTHONPATH",
           "TORCH_OFFLOAD_LIBRARY", "VIRTUAL_ENV")


def _without_toolkit(tmp_path, venv_bin=None):
    env = {k: v for k, v in os.environ.items() if k not in _HIDDEN and not k.startswith("PIP_")}
    path = [p for p in env.get("PATH", "").split(os.pathsep)
            if p and "cuda" not in p.lower() and not os.access(os.path.join(p, "nvcc"), os.X_OK)]
    env["PATH"] = os.pathsep.join(([str(venv_bin)] if venv_bin else []) + path)
    env["CUDAToolkit_ROOT"] = str(tmp_path / "no-cuda-toolkit")
    return env


def _configure(tmp_path, *defines):
    """CMake's configure as scripts/build.sh runs it (the toolkit, where there is one, in sight)."""
    import torch

    return _run(["cmake", "-S", ROOT, "-B", tmp_path / "build", f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                 "-DTORCH_OFFLOAD_BUILD_TESTS=OFF", "-DTORCH_OFFLOAD_BUILD_EXAMPLES=OFF", *defines],
                env=os.environ, cwd=tmp_path, timeout=300)


def test_configure_prints_no_warnings(tmp_path):
    result = _configure(tmp_path)
    output = result.stdout + result.stderr
    assert "CMake Warning" not in output and "CMake Deprecation" not in output, output
    assert "torch_offload: torch " in output


def test_cuda_off_builds_the_cpu_kernels_only(tmp_path):
    result = _configure(tmp_path, "-DTORCH_OFFLOAD_CUDA=OFF")
    assert "CUDA support OFF (none)" in result.stdout, result.stdout
    record = (tmp_path / "build" / "generated" / "torch_offload_build_record.h").read_text()
    assert "cuda_runtime=none;" in record


@pytest.mark.slow
def test_wheel_built_without_a_cuda_toolkit_installs_imports_and_trains(tmp_path):
    import torch

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], env=os.environ, cwd=tmp_path, timeout=300)
    python = venv / "bin" / "python"
    venv_site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     env=os.environ, cwd=tmp_path).stdout.strip()
    Path(venv_site, "torch_offload_test_shared.pth").write_text(str(_shared_site(tmp_path)) + "\n")
    env = _without_toolkit(tmp_path, venv / "bin")

    # The wheel, built as a user builds it, with the toolkit hidden.
    dist = tmp_path / "dist"
    _run([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", dist,
          "--config-settings=build-dir=" + str(tmp_path / "build"),
          "--config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON", ROOT],
         env=env, cwd=tmp_path)
    sys.path.insert(0, str(ROOT / "build_support"))
    try:
        import torch_offload_version
    finally:
        sys.path.pop(0)
    version = "0.2.0+" + torch_offload_version.local_label(torch.__version__)
    wheels = [p.name for p in dist.glob("*.whl")]
    assert len(wheels) == 1 and wheels[0].startswith(f"torch_offload-{version}-"), wheels

    # Installed with its dependencies resolved from what is there (torch only; no index).
    _run([python, "-m", "pip", "install", "--no-index", dist / wheels[0]], env=env, cwd=tmp_path)
    check = f"""
        import importlib.metadata, importlib.util, sys
        for name in {OPTIONAL!r}:
            assert importlib.util.find_spec(name) is None, name + " is visible in the fresh venv"
        import torch_offload
        from torch_offload._library.loading import build_record
        assert torch_offload.library_path.startswith({str(venv)!r}), torch_offload.library_path
        assert build_record(torch_offload.library_path) == {{"torch": torch.__version__, "cuda_runtime": "pip"}}
        assert importlib.metadata.version("torch_offload") == {version!r}
        assert not [m for m in sys.modules if m.split(".")[0] in {OPTIONAL!r}]
        """
    result = _run([python, "-c", "import torch\n" + textwrap.dedent(check) + textwrap.dedent(TRAIN_ONE_STEP)],
                  env=env, cwd=tmp_path, timeout=600)
    assert "trained" in result.stdout

    # The engine's and the modes' CPU tests, in this test venv (which has what they import), against
    # the library and C hooks built without a toolkit.
    library = Path(venv_site) / "torch_offload" / "libtorch_offload.so"
    suite_env = dict(os.environ, TORCH_OFFLOAD_LIBRARY=str(library))
    suite = [ROOT / "python_tests" / name for name in CPU_SUITE]
    result = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *suite],
                  env=suite_env, cwd=ROOT, timeout=1200)
    assert " passed" in result.stdout and " failed" not in result.stdout, result.stdout[-2000:]
