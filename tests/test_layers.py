"""The package's layering, read from the source with ``ast`` (nothing is imported).

Layers, bottom to top (docs/layout.md): core -> engines -> ops -> graph -> tools. A module
may import its own layer and the layers below, never one above; the import graph has no
circle; and a function body imports nothing of the package, nor any third-party module
other than the optional dependencies a user may not have installed (a deferred import hides
an edge from the reader and from this test). Each allowlist below says why its entries stay.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "qlinear"

#: (layer, its modules): a name matches itself and everything below it (``qlinear.graph``
#: covers ``qlinear.graph.kernels.float``). ``qlinear`` itself is the operators' face.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("qlinear._validate", "qlinear._geometry", "qlinear._requant", "qlinear.dtypes",
              "qlinear._params")),
    ("engines", ("qlinear._engine", "qlinear._elementwise", "qlinear._blas", "qlinear._native",
                 "qlinear._qlnative", "qlinear.engines")),
    ("ops", ("qlinear", "qlinear.conv", "qlinear.matmul", "qlinear.quantize", "qlinear.contrib",
             "qlinear._qdq", "qlinear._fmatmul", "qlinear._prepared",
             "qlinear.ops")),
    ("graph", ("qlinear.graph", "qlinear.backend", "qlinear.passes", "qlinear.qdq", "qlinear.modelfile",
               "qlinear._inline", "qlinear.session")),
    ("tools", ("qlinear.tools", "qlinear.cli", "qlinear.bench", "qlinear._noamx", "qlinear.__main__")),
]

#: Third-party packages a function may import when it needs them: optional dependencies
#: (extras), so that importing the module works without them.
OPTIONAL_DEPENDENCIES = frozenset({"onnxruntime", "matplotlib", "tqdm", "ray", "threadpoolctl"})

#: Function-level imports kept, (file, imported module) -> why.
ALLOWED_FUNCTION_IMPORTS: dict[tuple[str, str], str] = {
    # the speed suite checks for its optional dependencies (onnx, onnxruntime) when it runs, to
    # say in one line what to install; its model builders and the reference runner need onnx
    # only then (the CLI imports qlinear.tools.bench by name when `qlinear bench` runs)
    **{(f, m): "the bench's optional dependencies, imported when it runs" for f, m in (
        ("tools/bench/cases.py", "onnx"), ("tools/bench/command.py", "onnx"),
        ("tools/bench/run.py", "onnx.reference"))},
    # onnx is an optional dependency (the tools extra): `qlinear --help`, `--version` and the
    # error that says how to install it run without onnx (tests/test_hostile_cli.py), so the CLI
    # imports the modules that need onnx when a command runs.
    **{("cli.py", m): "needs onnx (the tools extra); imported when a command runs" for m in (
        "qlinear.tools.model", "qlinear.tools.compare", "qlinear.tools.conformance", "qlinear.tools.formats",
        "qlinear.backend",
        "qlinear.graph.proto", "onnx")},
    # `import qlinear` must not import onnx: the face imports qlinear.session on first use of
    # qlinear.InferenceSession (a module __getattr__), by name
    ("__init__.py", "importlib"): "the lazy InferenceSession attribute of the package face",
    **{("cli.py", m): "landed from main at the end of this branch (session, compare --dataset); hoisting left to their authors" for m in (
        'qlinear.tools.dataset', 'qlinear.tools.ortsat', 'qlinear.tools.sweep', 'qlinear.tools.workers')},
    **{("session.py", m): "landed from main at the end of this branch (session, compare --dataset); hoisting left to their authors" for m in (
        'onnx', 'qlinear._native', 'qlinear.backend', 'qlinear.modelfile', 'qlinear.qdq')},
    **{("tools/dataset.py", m): "landed from main at the end of this branch (session, compare --dataset); hoisting left to their authors" for m in (
        'qlinear.modelfile', 'qlinear.tools.arrayfile')},
    **{("tools/sweep.py", m): "landed from main at the end of this branch (session, compare --dataset); hoisting left to their authors" for m in (
        'onnx', 'qlinear.tools.table')},
    **{("tools/workers.py", m): "landed from main at the end of this branch (session, compare --dataset); hoisting left to their authors" for m in (
        'concurrent.futures', 'multiprocessing', 'onnx', 'qlinear._native', 'qlinear.tools.compare', 'qlinear.tools.dataset', 'qlinear.tools.model', 'qlinear.tools.sweep')},
    ("tools/ortsat.py", "onnx"): "the probe's model, built only when the probe runs: the CLI imports "
                                 "ortsat without onnx",
}

#: Upward edges kept, (importing module, imported module) -> why. Empty: nothing imports up.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

#: Import circles kept (sorted lists of modules). Empty.
ALLOWED_CIRCLES: list[list[str]] = []


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


#: Compiled extension modules (no source to read): the native engine's C module.
EXTENSIONS = frozenset({"qlinear._qlnative"})


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: pathlib.Path, known: set[str]):
    """(imported module, line, inside a function) for every import statement of ``path``; an
    imported name that is a module of the package (``from . import conv``) counts as that
    module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    in_function: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function.update(id(n) for n in ast.walk(fn) if n is not fn)
    out = []
    for node in ast.walk(tree):
        deferred = id(node) in in_function
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno, deferred) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path.name == "__init__.py", node)
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((sub if sub in known else target, node.lineno, deferred))
    return out


def _layer(module: str) -> int:
    best, rank = -1, None
    for i, (_, names) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, rank = len(name), i
    return rank


def _graph():
    modules = _modules()
    known = set(modules) | EXTENSIONS
    edges: dict[str, set[str]] = {m: set() for m in known}
    deferred = []
    for m, path in modules.items():
        for target, line, inside in _imports(m, path, known):
            own = target == "qlinear" or target.startswith("qlinear.")
            if own:
                # the module itself, or the package whose attribute was imported
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != m:
                    edges[m].add(target)
            if inside:
                deferred.append((m, path, target, line, own))
    return modules, edges, deferred


def test_every_module_has_a_layer():
    missing = [m for m in _modules() if _layer(m) is None]
    assert not missing, f"place these modules in a layer of tests/test_layers.py: {missing}"


def test_nothing_imports_upward():
    _, edges, _ = _graph()
    upward = sorted((m, t) for m, ts in edges.items() for t in ts
                    if _layer(t) > _layer(m) and (m, t) not in ALLOWED_UPWARD)
    names = [LAYERS[i][0] for i in range(len(LAYERS))]
    assert not upward, "upward imports: " + "; ".join(
        f"{m} ({names[_layer(m)]}) imports {t} ({names[_layer(t)]})" for m, t in upward)
    stale = [e for e in ALLOWED_UPWARD if e[1] not in edges.get(e[0], ())]
    assert not stale, f"ALLOWED_UPWARD lists edges that no longer exist: {stale}"


def test_no_import_circle():
    _, edges, _ = _graph()
    # Tarjan's strongly connected components: a component of more than one module is a circle
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    circles = [c for c in circles if c not in ALLOWED_CIRCLES]
    assert not circles, f"import circles: {circles}"


def test_no_function_level_imports():
    modules, _, deferred = _graph()
    bad, used = [], set()
    for m, path, target, line, own in deferred:
        rel = path.relative_to(PACKAGE).as_posix()
        key = next(((rel, t) for t in (target, target.split(".")[0]) if (rel, t) in ALLOWED_FUNCTION_IMPORTS), None)
        if key is not None:
            used.add(key)
            continue
        if not own and target.split(".")[0] in OPTIONAL_DEPENDENCIES:
            continue
        bad.append(f"qlinear/{rel}:{line} imports {target} inside a function")
    assert not bad, "function-level imports (move them to the top of the module):\n" + "\n".join(bad)
    stale = sorted(set(ALLOWED_FUNCTION_IMPORTS) - used)
    assert not stale, f"ALLOWED_FUNCTION_IMPORTS lists imports that no longer exist: {stale}"


@pytest.mark.parametrize("source, upward", [
    ("from qlinear.tools import ortsat\n", True),
    ("from ..tools.table import progress\n", True),
    ("from qlinear._validate import sizes\n", False),
])
def test_the_walk_sees_an_upward_import(tmp_path, source, upward):
    """The checks themselves: an import of the tools from the graph layer is found, whether
    absolute or relative, and a downward one is not."""
    path = PACKAGE / "graph" / "probe.py"
    known = set(_modules()) | EXTENSIONS | {"qlinear.graph.probe"}
    fake = tmp_path / "probe.py"
    fake.write_text(source)
    targets = [t for t, _, _ in _imports("qlinear.graph.probe", fake, known)]
    assert path.name == fake.name
    assert any(_layer(t) > _layer("qlinear.graph.probe") for t in targets) == upward
