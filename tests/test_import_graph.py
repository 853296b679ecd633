"""The import graph of dpsweep, sweeper, workers and api, read from the source (AST).

Checks, for module-level and function-level imports alike (``if TYPE_CHECKING:`` blocks
are left out: they never run):

1. no import cycle between modules;
2. no sweeper sub-package imports a higher one (:data:`SWEEPER_LAYERS`);
3. an import inside a function says why it is there, in a comment on its line or the line
   before (heavy import, optional extra, ...);
4. dpsweep imports nothing from workers (nor sweeper, nor api);
5. the optional fine-tuning extras (transformers, peft, timm, torchvision) are imported inside
   functions only.

No exception list: every sweeper sub-package imports only lower ones, and every function-level
import says why.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dpsweep", "sweeper", "workers", "api")

# Bottom first: a sub-package may import the ones before it, never the ones after.
# sweeper.settings (a module, not a sub-package) sits below them all.
SWEEPER_LAYERS = (
    "store",
    "privacy",
    "datasets",
    "sweeps",
    "runs",
    "artifacts",
    "driver",
    "audits",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    return {
        _module_name(p): p
        for package in PACKAGES
        for p in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


MODULES = _sources()


def _imported(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement loads (``from a import b`` may load ``a.b``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return [
        f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
        for alias in node.names
    ]


def _our_module(name: str) -> str | None:
    """The module of ours a dotted name falls in (``a.b.C`` -> ``a.b``), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every runtime import statement, and whether it sits inside a function."""

    def visit(
        node: ast.AST, in_function: bool
    ) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from visit(ast.Module(body=child.orelse, type_ignores=[]), in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            inner = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            yield from visit(child, inner)

    yield from visit(tree, False)


def _graph() -> tuple[dict[str, set[str]], dict[str, int]]:
    """Module -> the modules of ours it imports; file -> its function-level imports with no
    comment on the same or the preceding line."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    uncommented: dict[str, int] = {}
    for module, path in MODULES.items():
        text = path.read_text()
        lines = text.splitlines()
        for node, in_function in _imports(ast.parse(text)):
            for name in _imported(module, path, node):
                target = _our_module(name)
                if target is not None and target != module:
                    edges[module].add(target)
            if in_function:
                said = "#" in lines[node.lineno - 1] or (
                    node.lineno >= 2 and lines[node.lineno - 2].lstrip().startswith("#")
                )
                if not said:
                    key = str(path.relative_to(ROOT))
                    uncommented[key] = uncommented.get(key, 0) + 1
    return edges, uncommented


EDGES, UNCOMMENTED = _graph()


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    assert _cycles(EDGES) == []


def test_sweeper_subpackages_import_only_lower_layers() -> None:
    rank = {layer: i for i, layer in enumerate(SWEEPER_LAYERS)}
    upward = set()
    for module, targets in EDGES.items():
        parts = module.split(".")
        if parts[0] != "sweeper" or len(parts) < 2 or parts[1] not in rank:
            continue
        for target in targets:
            tparts = target.split(".")
            if (
                tparts[0] == "sweeper"
                and len(tparts) > 1
                and tparts[1] in rank
                and rank[tparts[1]] > rank[parts[1]]
            ):
                upward.add((module, target))
    assert upward == set(), (
        "a sweeper sub-package imports a higher layer: move the shared piece down into a "
        "small module of the lower layer"
    )


def test_function_level_imports_say_why() -> None:
    assert UNCOMMENTED == {}, (
        "an import inside a function needs a comment on its line or the line before saying "
        "why it is not at module level (heavy, optional, a cycle at run time): "
        f"{UNCOMMENTED} (file: count)"
    )


def test_dpsweep_imports_no_server_layer() -> None:
    bad = sorted(
        (module, target)
        for module, targets in EDGES.items()
        if module.split(".")[0] == "dpsweep"
        for target in targets
        if target.split(".")[0] in ("workers", "sweeper", "api")
    )
    assert bad == []


#: The packages of the optional extras ``finetune`` and ``vision``: never imported at module
#: level, so the base install and the SDK load without them (and import no more than before).
OPTIONAL_EXTRAS = ("transformers", "peft", "timm", "torchvision")


def test_optional_extras_are_imported_inside_functions_only() -> None:
    top_level = sorted(
        (module, name)
        for module, path in MODULES.items()
        for node, in_function in _imports(ast.parse(path.read_text()))
        if not in_function
        for name in _imported(module, path, node)
        if name.split(".")[0] in OPTIONAL_EXTRAS
    )
    assert top_level == [], (
        "a fine-tuning extra (transformers, peft, timm, torchvision) is imported at module "
        "level; import it inside the function that needs it, with a ConfigError naming the "
        f"extra to install when it is missing: {top_level}"
    )
