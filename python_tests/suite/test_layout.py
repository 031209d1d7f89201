"""The layout of python_tests/: a folder per subpackage of torch_offload or per concern, every folder
a package (test modules are python_tests.<folder>.test_<name>: two folders may hold files of the
same name), one conftest.py for the fixtures, helpers in support/ (named other than test_*), and no
test file importing another test file, conftest.py, or a helper by a bare name (what only works
with the test folder itself on sys.path)."""
import ast
from pathlib import Path

import pytest

import torch_offload

TESTS = Path(__file__).resolve().parents[1]
# Folders for what is not one subpackage of torch_offload (engine: the C++ engine through its ops,
# the manager and torch_offload/_library).
CONCERNS = {"apply", "distributed", "docs", "engine", "examples", "models", "packaging", "suite", "support"}


def _python_files():
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def _helper_names():
    """The modules of support/, which import as python_tests.support.<name> only."""
    return {p.stem for p in (TESTS / "support").glob("*.py") if p.stem != "__init__"}


def bad_imports(source: str, helpers=frozenset()) -> list:
    """The imports in `source` (anywhere in it) of a test module, of conftest, or of a helper module
    by a bare name: each as written."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            modules = [base] + [f"{base}.{alias.name}".lstrip(".") if node.module else alias.name
                                for alias in node.names]
        else:
            continue
        for module in modules:
            parts = [part for part in module.split(".") if part]
            if (any(part.startswith("test_") or part == "conftest" for part in parts)
                    or (parts and parts[0] in helpers and not module.startswith("."))):
                found.append(ast.unparse(node))
                break
    return found


@pytest.mark.parametrize("source, bad", [
    ("from conftest import DEVICES", True),
    ("from test_models import _tiny_llama", True),
    ("import test_compile", True),
    ("def f():\n    from test_selective_keep import matmuls_in_backward", True),
    ("from python_tests.engine.test_ops import save", True),
    ("from python_tests.engine import test_ops", True),
    ("from .test_ops import save", True),
    ("import gloo_ranks", True),
    ("from llama import _tiny_llama", True),
    ("from python_tests.support.llama import _tiny_llama", False),
    ("from python_tests.support import gloo_ranks", False),
    ("import torch.testing", False),
    ("from torch.utils.checkpoint import checkpoint", False),
])
def test_the_import_check_tells_test_files_from_helpers(source, bad):
    assert bool(bad_imports(source, {"gloo_ranks", "llama"})) is bad


def test_no_test_file_imports_another_test_file_or_conftest():
    helpers = _helper_names()
    found = {str(p.relative_to(TESTS)): bad_imports(p.read_text(encoding="utf-8"), helpers) for p in _python_files()}
    assert not {path: imports for path, imports in found.items() if imports}, \
        "import what several test files share from python_tests/support/ (fixtures: conftest.py, by name)"


def test_every_folder_is_a_package_and_holds_no_second_conftest():
    folders = {p.parent for p in _python_files()}
    assert not [str(f.relative_to(TESTS)) for f in folders if not (f / "__init__.py").is_file()]
    assert [str(p.relative_to(TESTS)) for p in TESTS.rglob("conftest.py")] == ["conftest.py"]


def test_test_files_are_in_the_folder_of_what_they_test():
    assert not sorted(p.name for p in TESTS.glob("test_*.py")), "put it in the folder of what it tests"
    assert not sorted(p.name for p in (TESTS / "support").rglob("test_*.py")), "support/ holds no tests"
    package = Path(torch_offload.__file__).resolve().parent
    subpackages = {p.parent.relative_to(package).as_posix() for p in package.glob("*/**/__init__.py")}
    folders = {f.parent.relative_to(TESTS).as_posix() for f in TESTS.glob("*/**/__init__.py")}
    assert not sorted(f for f in folders if f not in subpackages and f.split("/")[0] not in CONCERNS)
