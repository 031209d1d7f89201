"""torch_offload changes nothing of torch's for the whole process: no module attribute of torch is
assigned (torch.nn.functional's functions stay torch's own, in every thread), and no class of ours
overrides a private member of a torch class it derives from (such as
TorchDispatchMode._should_skip_dynamo). Checked on the package's source (ast) and on its classes."""
import ast
import importlib
import inspect
import pathlib
import pkgutil

import torch_offload

PACKAGE = pathlib.Path(torch_offload.__file__).parent


def _torch_names(tree: ast.Module) -> set:
    """Names that a module binds to torch or to something imported from it."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch" or alias.name.startswith("torch."):
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module == "torch" or node.module.startswith("torch.")):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _root(expression):
    while isinstance(expression, (ast.Attribute, ast.Subscript)):
        expression = expression.value
    return expression.id if isinstance(expression, ast.Name) else None


def _writes_to_torch(tree: ast.Module) -> list:
    """(line, source) of each assignment to, or setattr/delattr on, an attribute of a torch object."""
    torch_names, found = _torch_names(tree), []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            if node.args and _root(node.args[0]) in torch_names:
                found.append((node.lineno, ast.unparse(node)))
        for target in targets:
            elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
            for element in elements:
                if isinstance(element, ast.Attribute) and _root(element) in torch_names:
                    found.append((node.lineno, ast.unparse(element)))
    return found


def _source_files():
    return sorted(PACKAGE.rglob("*.py"))


def test_the_checks_see_what_they_look_for():
    patched = ast.parse("import torch\nimport torch.nn.functional as F\nfrom torch.nn import functional\n"
                        "from torch.utils._python_dispatch import TorchDispatchMode\n"
                        "F.linear = None\ntorch.nn.functional.scaled_dot_product_attention = None\n"
                        "setattr(functional, 'linear', None)\nTorchDispatchMode._should_skip_dynamo = None\n"
                        "x = F.linear\nlocal.linear = F.linear\n")
    assert sorted(line for line, _ in _writes_to_torch(patched)) == [5, 6, 7, 8]

    class _Overriding(torch_offload.policies.interception.TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            return False

    assert _private_overrides(_Overriding) == ["_should_skip_dynamo"]


def test_no_module_of_the_package_writes_to_torch():
    found = {}
    for path in _source_files():
        writes = _writes_to_torch(ast.parse(path.read_text(), str(path)))
        if writes:
            found[str(path.relative_to(PACKAGE.parent))] = writes
    assert not found, f"assignments to torch's attributes (process-wide changes): {found}"


def _defined_in_body(cls, name: str) -> bool:
    """Whether cls's own code defines `name` (not what a metaclass or ABC adds to it)."""
    value = vars(cls)[name]
    function = getattr(value, "__func__", getattr(value, "fget", value))
    return getattr(function, "__qualname__", None) == f"{cls.__qualname__}.{name}"


def _private_overrides(cls) -> list:
    """Names cls's own code defines that are private members of a torch class it derives from."""
    torch_bases = [base for base in cls.__mro__[1:] if base.__module__.split(".")[0] == "torch"]
    return [name for name in vars(cls)
            if name.startswith("_") and not name.endswith("__") and _defined_in_body(cls, name)
            and any(hasattr(base, name) for base in torch_bases)]


def test_no_class_of_the_package_overrides_a_private_torch_member():
    found = {}
    for module_info in pkgutil.walk_packages([str(PACKAGE)], "torch_offload."):
        if module_info.name.endswith("__main__"):
            continue
        module = importlib.import_module(module_info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and _private_overrides(cls):
                found[f"{module.__name__}.{cls.__qualname__}"] = _private_overrides(cls)
    assert not found, f"overrides of private torch members: {found}"
