"""The install steps the README shows work as written for a new user: in a fresh virtual
environment, in the root of a copy of the repository, each command of the README's "Install into
your own environment" block runs as a shell line, in order; then torch_offload imports from the
environment, outside the copy, and trains a step. docs/getting-started.md shows the same commands
(checked here, so that the two pages cannot drift apart), and the block installs every build
requirement of pyproject.toml's [build-system] before the --no-build-isolation install.

The fresh venv sees the test venv's packages, torch among them, through a .pth file naming a
directory of links to them (test_build_without_cuda_toolkit.py's), less the optional packages, the
installed torch_offload and the build backend scikit-build-core: that one the README's steps
install. pip runs without an index, from a folder of wheels: $TORCH_OFFLOAD_WHEELHOUSE when set,
else the build requirements downloaded from the package index once (the test skips, saying so,
where neither is there)."""
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from python_tests.support.fresh_venv import _run, _shared_site
from python_tests.support.distribution import ROOT, TRAIN_ONE_STEP

README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"


def _install_commands(page: Path, heading: str):
    """The command lines of the first bash block under `heading`, comments dropped."""
    text = page.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    block = re.search(r"^```bash\n(.*?)^```", text[start:], re.S | re.M)
    assert block, f"{page.name}: no bash block under '## {heading}'"
    commands = []
    for line in block.group(1).splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return commands


def _readme_commands():
    return _install_commands(README, "Install into your own environment")


def _build_requirements():
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["build-system"]["requires"]


def test_getting_started_shows_the_readme_install_commands():
    assert _install_commands(GETTING_STARTED, "Installing into your own environment") == _readme_commands()


def test_the_install_commands_install_the_build_requirements_first():
    commands = _readme_commands()
    final = ["pip", "install", "--no-build-isolation", "."]
    assert commands[-1] == final, commands
    installed = {word for command in commands[:-1] for word in command[2:]
                 if command[:2] == ["pip", "install"] and not word.startswith("-")}
    missing = [r for r in _build_requirements() if r not in installed]
    assert not missing, f"the README installs {sorted(installed)} before building, not {missing}"
    assert any(word.startswith("torch") for word in installed), "the README installs no torch to build against"


def _wheelhouse(tmp_path):
    """A folder holding a wheel of each build requirement."""
    given = os.environ.get("TORCH_OFFLOAD_WHEELHOUSE")
    if given:
        return Path(given)
    wheels = tmp_path / "wheels"
    result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                             "-d", str(wheels), *_build_requirements()],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        pytest.skip("needs the build requirements' wheels: the package index could not be reached and "
                    f"TORCH_OFFLOAD_WHEELHOUSE is not set ({result.stderr.strip().splitlines()[-1:]})")
    return wheels


def _copy_of_the_repository(tmp_path):
    """The files of the repository (tracked, and untracked but not ignored), as a clone holds them."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    copy = tmp_path / "torch_offload"
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.split("\0")):
            source = ROOT / name
            if source.is_file():
                (copy / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, copy / name)
    else:  # not a git checkout: everything but what builds leave
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", "build", "build-*", "__pycache__"))
    return copy


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_the_readme_install_steps_work_in_a_fresh_venv(tmp_path):
    wheels = _wheelhouse(tmp_path)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], env=os.environ, cwd=tmp_path, timeout=300)
    python = venv / "bin" / "python"
    venv_site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     env=os.environ, cwd=tmp_path).stdout.strip()
    shared = _shared_site(tmp_path)
    for entry in shared.iterdir():  # the build backend is what the README's steps install
        if entry.name.split("-")[0].lower() == "scikit_build_core":
            entry.unlink()
    Path(venv_site, "torch_offload_test_shared.pth").write_text(f"{shared}\n")

    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TORCH_OFFLOAD_LIBRARY", "VIRTUAL_ENV") and not k.startswith("PIP_")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels), PIP_DISABLE_PIP_VERSION_CHECK="1")
    clone = _copy_of_the_repository(tmp_path)

    def shell(command):
        return subprocess.run(shlex.join(command), shell=True, env=env, cwd=clone, capture_output=True,
                              text=True, timeout=3600)

    commands = _readme_commands()
    # What getting-started.md says of the last command alone: without the build backend it stops
    # at once, naming it.
    alone = shell(commands[-1])
    assert alone.returncode != 0 and "No module named 'scikit_build_core'" in alone.stdout + alone.stderr, (
        alone.stdout[-2000:] + alone.stderr[-2000:])
    for command in commands:
        result = shell(command)
        assert result.returncode == 0, f"{shlex.join(command)}\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"

    # Installed: imported from outside the copy, the library is the environment's, and it trains.
    check = f"""
        import torch, torch_offload
        assert torch_offload.library_path.startswith({str(venv)!r}), torch_offload.library_path
        """
    result = _run([python, "-c", textwrap.dedent(check) + textwrap.dedent(TRAIN_ONE_STEP)],
                  env=env, cwd=tmp_path, timeout=600)
    assert "trained" in result.stdout
