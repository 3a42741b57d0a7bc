"""The package's imports go one way: down the floors that dflash_top/__init__.py lists. Every
module is read (imports under `if TYPE_CHECKING:` and inside functions included), and a module
that imports one of its own floor or above fails with the import named."""

import ast
import os

from conftest import PYTHON_DIR

PACKAGE = os.path.join(PYTHON_DIR, "dflash_top")

#: Lowest first; a module may import the modules of lower floors only.
FLOORS = [
    ["protocol", "job", "sites"],
    ["wire", "threads", "queues", "cuda", "auto.common"],
    ["serve", "auto.table", "auto.record", "auto.queues"],
    ["producer", "auto.loss"],
    ["auto.torch_hooks"],
    ["profiler", "auto.session"],
    ["auto"],
    ["__init__", "__main__"],
]
FLOOR = {m: i for i, names in enumerate(FLOORS) for m in names}


def module_name(path):
    """`wire` for dflash_top/wire.py, `auto` for dflash_top/auto/__init__.py, `auto.hooks` for
    dflash_top/auto/hooks.py; the package's own __init__.py is `__init__`."""
    parts = os.path.relpath(path, PACKAGE)[: -len(".py")].split(os.sep)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def modules():
    for root, _, files in os.walk(PACKAGE):
        for f in sorted(files):
            if f.endswith(".py"):
                yield os.path.join(root, f)


def imports(path, name):
    """The package's modules that the module `name` (at `path`) imports, with their lines."""
    tree = ast.parse(open(path).read(), path)
    if path.endswith("__init__.py"):
        package = [] if name == "__init__" else name.split(".")
    else:
        package = name.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
            elif (node.module or "").split(".")[0] == "dflash_top":
                base = []
            else:
                continue
            mod = [p for p in (node.module or "").split(".") if p]
            if not node.level:
                mod = mod[1:]
            if mod:
                out.append((".".join(base + mod), node.lineno))
            else:  # `from . import a, b`: the modules a and b
                out += [(".".join(base + [a.name]), node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "dflash_top" and len(parts) > 1:
                    out.append((".".join(parts[1:]), node.lineno))
    return out


def test_every_module_has_a_floor():
    names = {module_name(p) for p in modules()}
    assert names == set(FLOOR), "floors to add or remove: %s" % (names ^ set(FLOOR))


def test_imports_go_down_the_floors():
    bad = []
    for path in modules():
        name = module_name(path)
        for target, line in imports(path, name):
            if target not in FLOOR:
                bad.append("%s:%d imports %s, no module of the package" % (name, line, target))
            elif FLOOR[target] >= FLOOR[name]:
                bad.append(
                    "%s:%d imports %s (floor %d) from floor %d: imports go down only"
                    % (name, line, target, FLOOR[target], FLOOR[name])
                )
    assert not bad, "\n".join(bad)
