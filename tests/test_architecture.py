"""The package's shape, read from its source (ast and tokenize only: nothing is imported, so no
torch): no import cycle, a comment on every import inside a function (saying why it is late),
and no module over MAX_LINES lines but those allowed below, each with its reason."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "ovalp_flwr"
APPS = (REPO / "server_app.py", REPO / "client_app.py")  # wiring; late imports checked too

MAX_LINES = 400
# path (from the repository root) -> why it may be longer than MAX_LINES
LONG_MODULES: dict[str, str] = {  # none today: config.py and strategy.py were split (#47)
}


# --- the import graph -----------------------------------------------------------------------


def module_files(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under `package_dir` (a package: its
    __init__.py is the package's own name)."""
    modules = {}
    for file in sorted(package_dir.rglob("*.py")):
        parts = file.relative_to(package_dir.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return modules


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """`name`, or the nearest enclosing module we have (`pkg.mod.attr` -> `pkg.mod`)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in modules else None


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
              modules: dict[str, Path]) -> set[str]:
    """The package's modules an import statement in `module` names (submodules included)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:  # relative: from the module's package, one level up per extra dot
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            stem = ".".join([*base, *([node.module] if node.module else [])])
        else:
            stem = node.module or ""
        # `from pkg import mod`: the submodule when there is one, else the name is pkg's own
        names = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem
                 for a in node.names]
    return {target for name in names if (target := _known(name, modules))}


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at any depth (functions, `if` blocks and
    TYPE_CHECKING included). A package's __init__ importing its submodules is an edge like
    any other, and so is a submodule importing its package."""
    modules = module_files(package_dir)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, file in modules.items():
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= _imported(node, name, file.name == "__init__.py", modules)
        graph[name].discard(name)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (`[a, b, ..., a]`) per strongly connected group of modules; [] if acyclic."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan; the graph is a few hundred modules deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(set(group), graph) for group in sorted(groups)]


def _cycle_in(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest way from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{sorted(group)} is no cycle")


def test_the_package_has_no_import_cycle() -> None:
    cycles = import_cycles(import_graph(PACKAGE))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_graph_sees_imports_at_every_depth() -> None:
    """Guards the test above against reading nothing: edges it must find, of each kind."""
    graph = import_graph(PACKAGE)
    assert "ovalp_flwr.data.registry" in graph["ovalp_flwr.data.options"]  # top level
    assert "ovalp_flwr.ops.preflight" in graph["ovalp_flwr.ops.launch"]  # inside a function
    assert "ovalp_flwr.federation.protocol" in graph["ovalp_flwr.ova.client"]  # from pkg import mod
    assert "ovalp_flwr.features.cache.build" in graph["ovalp_flwr.features.cache"]  # __init__


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "fake"


@pytest.mark.parametrize("files, cycle", [
    pytest.param({"fake/__init__.py": "",
                  "fake/a.py": "def f():\n    from fake import b\n",
                  "fake/b.py": "from fake.a import f\n"},
                 ["fake.a", "fake.b", "fake.a"], id="through-a-function"),
    pytest.param({"fake/__init__.py": "",
                  "fake/sub/__init__.py": "from fake.sub.impl import X\ndef helper(): ...\n",
                  "fake/sub/impl.py": "from fake.sub import helper\nX = 1\n"},
                 ["fake.sub", "fake.sub.impl", "fake.sub"], id="package-and-its-submodule"),
    pytest.param({"fake/__init__.py": "",
                  "fake/a.py": "from . import b\n",
                  "fake/b.py": "import fake.c as c\n",
                  "fake/c.py": "if True:\n    from .a import *\n"},
                 ["fake.a", "fake.b", "fake.c", "fake.a"], id="relative-and-dotted"),
])
def test_a_cycle_is_found_and_named(tmp_path: Path, files: dict[str, str],
                                    cycle: list[str]) -> None:
    assert import_cycles(import_graph(_write(tmp_path, files))) == [cycle]


def test_no_cycle_where_imports_only_go_down(tmp_path: Path) -> None:
    package = _write(tmp_path, {"fake/__init__.py": "from fake.a import f\n",
                                "fake/a.py": "from fake import b\ndef f():\n    import fake.b\n",
                                "fake/b.py": "import os\n"})
    graph = import_graph(package)
    assert graph == {"fake": {"fake.a"}, "fake.a": {"fake.b"}, "fake.b": set()}
    assert import_cycles(graph) == []


# --- late imports ---------------------------------------------------------------------------


def late_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Import statements inside a function or method, at any depth."""
    found = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                found.append(child)
            walk(child, in_function or isinstance(child, (ast.FunctionDef,
                                                          ast.AsyncFunctionDef, ast.Lambda)))

    walk(tree, False)
    return found


def uncommented_late_imports(file: Path, root: Path = REPO) -> list[str]:
    """`path:line: statement` (path from `root`) for each late import with no comment on its
    lines or on a comment line just above it."""
    source = file.read_text(encoding="utf-8")
    lines = source.splitlines()
    commented = {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
                 if token.type == tokenize.COMMENT}
    missing = []
    for node in late_imports(ast.parse(source, str(file))):
        own = range(node.lineno, (node.end_lineno or node.lineno) + 1)
        above = node.lineno - 1
        if any(n in commented for n in own) or (
                above in commented and lines[above - 1].lstrip().startswith("#")):
            continue
        missing.append(f"{file.relative_to(root)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return missing


def test_every_late_import_says_why() -> None:
    """An import inside a function saves start-up time (or keeps a heavy library out of a
    process); the comment on its line, or the line above, says which."""
    files = [*sorted(PACKAGE.rglob("*.py")), *APPS]
    missing = [line for file in files for line in uncommented_late_imports(file)]
    assert not missing, "imports inside functions without a comment:\n" + "\n".join(missing)


def test_the_late_import_check_can_fail(tmp_path: Path) -> None:
    file = tmp_path / "mod.py"
    file.write_text("import os\n\n"
                    "def f():\n    import json  # late: reason\n"
                    "    # late: reason\n    from typing import (\n        Any,\n    )\n"
                    "    x = 1  # a comment on a line that is no import\n    import csv\n"
                    "    class C:\n        def g(self):\n            import re\n")
    assert uncommented_late_imports(file, tmp_path) == ["mod.py:10: import csv",
                                                         "mod.py:13: import re"]


# --- module size ----------------------------------------------------------------------------


def long_modules(package_dir: Path) -> dict[str, int]:
    """Path (from the repository root) -> line count, for each module over MAX_LINES."""
    sizes = {str(f.relative_to(package_dir.parent)): len(f.read_text(encoding="utf-8").splitlines())
             for f in sorted(package_dir.rglob("*.py"))}
    return {path: n for path, n in sizes.items() if n > MAX_LINES}


def test_no_module_is_over_the_limit_unless_allowed() -> None:
    long = long_modules(PACKAGE)
    for path, n in long.items():  # shown with -s (or -rA): what the allow-list covers
        print(f"{path}: {n} lines (> {MAX_LINES}); allowed: {LONG_MODULES.get(path, 'no')}")
    refused = {path: n for path, n in long.items() if path not in LONG_MODULES}
    assert not refused, (f"modules over {MAX_LINES} lines (split them, or allow them in "
                         f"LONG_MODULES with the reason): {refused}")
    assert all(reason for reason in LONG_MODULES.values())
    gone = [path for path in LONG_MODULES if not (REPO / path).is_file()]
    assert not gone, f"LONG_MODULES names modules that no longer exist: {gone}"


# --- who sees the whole run config ----------------------------------------------------------

# path -> why it reads the whole RunConfig: the apps, the run pipeline and its paths, the
# strategy's wiring, the client side's one parse, and the launchers. Every other part is given
# its own group (`config.privacy`, `config.finetuning`, ...) or what was made from them.
WHOLE_CONFIG: dict[str, str] = {
    "ovalp_flwr/config.py": "defines it",
    "server_app.py": "builds it from Flower's run config",
    "ovalp_flwr/federation/node.py": "the client side's parse (run_config) and a client's rows "
                                     "from its groups (node_data)",
    "ovalp_flwr/runs/pipeline.py": "the run both paths share",
    "ovalp_flwr/ova/server.py": "the cached path's hooks in that run",
    "ovalp_flwr/finetune/server.py": "the encoder path's hooks in that run",
    "ovalp_flwr/federation/rounds.py": "the strategy's wiring, from five groups",
    "ovalp_flwr/federation/local_grid.py": "launches a run in process",
    "ovalp_flwr/ops/preflight.py": "validates a run before any process starts",
    "ovalp_flwr/experiments/sweep.py": "validates and compares every run of a preset",
}


def modules_naming(name: str) -> set[str]:
    """Path (from the repository root) of every package or app module whose code names `name`
    (comments and strings do not count)."""
    found = set()
    for path in [*sorted(PACKAGE.rglob("*.py")), *APPS]:
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
        if any(t.type == tokenize.NAME and t.string == name for t in tokens):
            found.add(str(path.relative_to(REPO)))
    return found


def test_only_the_apps_pipeline_and_launchers_see_the_whole_run_config() -> None:
    naming = modules_naming("RunConfig")
    assert naming == set(WHOLE_CONFIG), (
        f"new: {sorted(naming - set(WHOLE_CONFIG))} (give them their group instead); "
        f"gone: {sorted(set(WHOLE_CONFIG) - naming)} (take them off WHOLE_CONFIG)")
    assert len(WHOLE_CONFIG) <= 10
