"""The architecture of docs/ARCHITECTURE.md, checked from the code's imports.

- Layers: pager < codecs < spine < ops < spark_integration < tools. A module imports
  from its own layer or the layers below it, never above. Inside the spine the
  sub-packages follow the data: data < storage < persist < read < build < the facade
  (trace, engine, the package's surface).
- Operators and the Spark integration use the declared surface of the layers below
  them: ``arrangedb.spine``, ``arrangedb.pager`` and ``arrangedb.codecs`` themselves,
  not their modules.
- No import cycle between modules, imports inside functions included; no module
  imports another module's private (underscored) names.
- No module of the engine is much over 400 lines.
"""

from __future__ import annotations

import ast
import pathlib

import arrangedb

ROOT = pathlib.Path(arrangedb.__file__).parent
LAYERS = ["pager", "codecs", "spine", "ops", "spark_integration", "tools"]
SPINE_ORDER = ["data", "storage", "persist", "read", "build", None]   # None: the facade
SURFACE_ONLY = {"ops", "spark_integration"}
MAX_LINES = 420


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for layer in LAYERS:
        for f in sorted((ROOT / layer).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("arrangedb",) + parts)
            mods[name.removesuffix(".__init__")] = f
    return mods


MODULES = _modules()


def _imports(name: str, path: pathlib.Path):
    """(imported module, imported name or None, line) for every arrangedb import."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("arrangedb"):
                    yield a.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            if not base.startswith("arrangedb"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:
                    yield sub, None, node.lineno
                else:
                    yield base, a.name, node.lineno


def _owner(module: str) -> str | None:
    while module not in MODULES and "." in module:
        module = module.rsplit(".", 1)[0]
    return module if module in MODULES else None


def _rank(module: str) -> tuple[int, int]:
    parts = module.split(".")
    layer = LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else -1
    sub = 0
    if len(parts) > 1 and parts[1] == "spine":
        inner = parts[2] if len(parts) > 2 and parts[2] in SPINE_ORDER else None
        sub = SPINE_ORDER.index(inner)
    return layer, sub


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for name, path in MODULES.items():
        for module, _, _ in _imports(name, path):
            target = _owner(module)
            if target and target != name:
                edges[name].add(target)
    return edges


def test_no_import_points_up():
    wrong = []
    for name, path in MODULES.items():
        for module, _, line in _imports(name, path):
            target = _owner(module)
            if target is None or target == name:
                continue
            # a package's surface imports its own modules: that is what declares it
            if path.name == "__init__.py" and target.startswith(name + "."):
                continue
            if _rank(target) > _rank(name):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "imports pointing up a layer:\n" + "\n".join(wrong)


def test_operators_use_the_declared_surface():
    wrong = []
    for name, path in MODULES.items():
        layer = name.split(".")[1]
        if layer not in SURFACE_ONLY:
            continue
        for module, _, line in _imports(name, path):
            parts = module.split(".")
            below = parts[1] if len(parts) > 1 else None
            if below in ("spine", "pager", "codecs") and len(parts) > 2:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "imports below a layer's surface:\n" + "\n".join(wrong)


def test_no_import_cycle():
    edges = _edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in MODULES:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_private_names_across_modules():
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {module}.{n}"
             for name, path in MODULES.items()
             for module, n, line in _imports(name, path)
             if n and n.startswith("_") and not n.startswith("__")
             and _owner(module) != name]
    assert not wrong, "private names imported across modules:\n" + "\n".join(wrong)


def test_modules_stay_small():
    big = {str(p.relative_to(ROOT)): n for p in MODULES.values()
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_the_checker_sees_a_cycle_and_an_upward_import(monkeypatch):
    """The checks can fail: a made-up edge from the pager up to ops is both."""
    real = _edges()
    real["arrangedb.pager.budget"].add("arrangedb.ops.join")
    real["arrangedb.ops.join"].add("arrangedb.pager.budget")
    monkeypatch.setattr(__import__(__name__), "_edges", lambda: real)
    import pytest

    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycle()
    assert _rank("arrangedb.ops.join") > _rank("arrangedb.pager.budget")
    assert _rank("arrangedb.spine.read.cursor") > _rank("arrangedb.spine.storage.part")
