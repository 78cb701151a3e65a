"""The layering of docs/architecture.md, read from the package's import statements (also
those inside functions) and its ``import_module`` calls that name a module: who may import
whom, no import circle, no oversized CLI module."""

from __future__ import annotations

import ast
from importlib.util import resolve_name
from pathlib import Path

import nvalchemi_lammps

ROOT = Path(nvalchemi_lammps.__file__).parent
PACKAGE = ROOT.name
#: The largest a module of the command line may grow (lines).
CLI_LINES = 450


def _modules() -> dict[str, Path]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _named_by(node: ast.expr, constants: dict[str, str]) -> str | None:
    """The text of a string literal, or of a module-level ``NAME = "..."`` constant."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return constants.get(node.id) if isinstance(node, ast.Name) else None


def _imported_by_name(node: ast.Call, constants: dict[str, str]) -> str | None:
    """The module ``importlib.import_module(NAME[, PACKAGE])`` (or ``import_module(...)``)
    imports, where the call names it: a literal or a module constant, relative names
    resolved against a literal package, ``__name__`` or ``__package__``."""
    func = node.func
    callee = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if callee != "import_module" or not node.args:
        return None
    target = _named_by(node.args[0], constants)
    if target is None or not target.startswith("."):
        return target
    anchor = node.args[1] if len(node.args) > 1 else None
    anchor = next((k.value for k in node.keywords if k.arg == "package"), anchor)
    package = anchor and _named_by(anchor, constants)
    return resolve_name(target, package) if package else None


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its text, by import
    statement or by an ``import_module`` call that names the module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    constants = {"__name__": name, "__package__": package}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            constants[node.targets[0].id] = node.value.value
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            targets = [t for t in [_imported_by_name(node, constants)] if t]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
            # ``from . import mod``: the package is the importer's own ancestor, imported
            # before it; what it brings is the submodules. Names that are not modules come
            # from the package's own text.
            if not (name.startswith(base + ".") and all(t in modules for t in targets)):
                targets = [base, *targets]
        else:
            continue
        for target in targets:
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                found.add(target)
    return found


MODULES = _modules()
GRAPH = {name: _imports(name, path, MODULES) for name, path in MODULES.items()}


def _under(name: str, layer: str) -> bool:
    full = f"{PACKAGE}.{layer}"
    return name == full or name.startswith(full + ".")


def _violations(importer: str, forbidden: list[str]) -> list[tuple[str, str]]:
    return [
        (name, target)
        for name, targets in GRAPH.items()
        if _under(name, importer)
        for target in targets
        if any(_under(target, f) for f in forbidden)
    ]


#: The tools layer outside ``cli``: running LAMMPS, the reference, structures, the probe.
TOOLS = ["lammps_run", "reference", "structures", "receptive_field"]


def test_layers_import_only_downwards():
    assert (
        _violations("contract", ["potentials", "engine", "frontends", "_model_file", "cli"]) == []
    )
    assert _violations("potentials", ["engine", "frontends", "_model_file", "cli", *TOOLS]) == []
    assert _violations("engine", ["potentials", "frontends", "_model_file", "cli"]) == []
    assert _violations("_model_file", ["frontends", "engine", "cli"]) == []
    assert _violations("frontends", ["potentials", "cli", *TOOLS]) == []


def test_front_door_internals_stay_inside_the_front_doors():
    private = [f"{PACKAGE}.frontends._lammps_comm", f"{PACKAGE}.frontends._step"]
    outside = [
        (name, target)
        for name, targets in GRAPH.items()
        if not _under(name, "frontends")
        for target in targets
        if target in private
    ]
    assert outside == []


def test_no_import_circle():
    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), list(GRAPH[start])
        while todo:
            name = todo.pop()
            if name == goal:
                return True
            if name not in seen:
                seen.add(name)
                todo.extend(GRAPH[name])
        return False

    # a package that imports its own submodules is no circle; anything else that comes back
    # to where it started is
    circles = [
        (name, target)
        for name, targets in GRAPH.items()
        for target in targets
        if not name.startswith(target + ".")
        and reaches(target, name)
        and not target.startswith(name + ".")
    ]
    assert circles == []


def test_import_module_calls_count_as_imports(tmp_path):
    """``importlib.import_module`` with a module named in the text (literally, by a module
    constant, or relative to the package) is an import like any other; a name computed at
    run time is not read."""
    module = tmp_path / "module.py"
    module.write_text(
        "import importlib\n"
        "from importlib import import_module\n"
        f'DOOR = "{PACKAGE}.frontends.mliap"\n'
        "def f(name):\n"
        "    import_module(DOOR)\n"
        f'    importlib.import_module("{PACKAGE}.engine")\n'
        '    import_module(".cli", __package__)\n'
        '    import_module(".reference", package=__package__)\n'
        "    import_module(name)\n"
    )
    found = _imports(f"{PACKAGE}.module", module, MODULES)
    assert found == {f"{PACKAGE}.{m}" for m in ("frontends.mliap", "engine", "cli", "reference")}


def test_no_cli_module_is_oversized():
    sizes = {path.name: len(path.read_text().splitlines()) for path in (ROOT / "cli").glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > CLI_LINES} == {}


#: The command-line tools and the benchmarks: they drive the package from outside it.
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TOOL_FILES = {
    **{f"benchmarks.{p.stem}": p for p in sorted(BENCHMARKS.glob("*.py"))},
    **{name: path for name, path in MODULES.items() if _under(name, "cli")},
}


def test_benchmarks_keep_out_of_front_door_internals():
    """The benchmarks read a session through its public hooks (``PluginSession.timings``,
    ``opened_sessions``), as the package's own tools do."""
    assert BENCHMARKS.is_dir() and len(TOOL_FILES) > len(list(BENCHMARKS.glob("*.py")))
    private = {f"{PACKAGE}.frontends._lammps_comm", f"{PACKAGE}.frontends._step"}
    inside = {
        name: sorted(_imports(name, path, MODULES) & private) for name, path in TOOL_FILES.items()
    }
    assert {name: found for name, found in inside.items() if found} == {}


def _patched(path: Path) -> list[str]:
    """Assignments in ``path`` that replace a private attribute of another object (``x._y =
    ...``, ``setattr(x, "_y", ...)``) or any attribute of an imported module or class."""
    tree = ast.parse(path.read_text())
    imported = {
        (alias.asname or alias.name).partition(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }

    def patches(owner: ast.expr, attr: str) -> bool:
        base = owner
        while isinstance(base, ast.Attribute):
            base = base.value
        private = attr.startswith("_") and not attr.endswith("__")
        if isinstance(base, ast.Name) and base.id == "self":
            return False
        return private or (isinstance(base, ast.Name) and base.id in imported)

    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and patches(node.args[0], str(node.args[1].value))
        ):
            found.append(f"{path.name}:{node.lineno}")
        while targets:
            target = targets.pop()
            if isinstance(target, ast.Tuple | ast.List):
                targets.extend(target.elts)
            elif isinstance(target, ast.Attribute) and patches(target.value, target.attr):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_benchmarks_and_cli_patch_nothing():
    """What a tool measures, it reads through a public hook: it replaces no private method
    and no function of a module it imports."""
    assert [spot for path in TOOL_FILES.values() for spot in _patched(path)] == []
