"""Running commands for a fresh virtual environment that shares this one's packages."""
import subprocess
import sysconfig
from pathlib import Path

from python_tests.support.distribution import OPTIONAL


def _run(command, env, cwd, timeout=1800):
    result = subprocess.run([str(c) for c in command], env=env, cwd=cwd, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, f"{command}\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    return result


def _shared_site(tmp_path):
    """A directory of links to this venv's site-packages, less the optional packages and the
    installed torch_offload (and pip, which the fresh venv has its own of)."""
    leave_out = set(OPTIONAL) | {"torch_offload", "pip", "mpl_toolkits", "pylab"}
    site = Path(sysconfig.get_paths()["purelib"])
    shared = tmp_path / "shared-site"
    shared.mkdir()
    for entry in site.iterdir():
        name = entry.name.split("-")[0].removesuffix(".py").lower()
        if name in leave_out or entry.suffix == ".pth" or name.startswith("__editable__"):
            continue
        (shared / entry.name).symlink_to(entry)
    return shared
