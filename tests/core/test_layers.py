"""The import-layer contract: each module of gem_core imports only modules of its own layer or below,
and no modules import each other in a circle. Every import counts, those inside functions and under
``TYPE_CHECKING`` included: an import hidden in a function is still an arrow of the design.

The layers (lowest first); a module's layer is that of its top-level name under ``gem_core``:
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LAYERS: list[tuple[str, ...]] = [
    (
        "errors",
        "params",
        "parsing",
        "utils",
        "cli_support",
        "algo",
        "models",
        "precision",
        "experiment",
        "tiny",
    ),  # L0: no module above (experiment: plain data; tiny: the built-here model)
    (
        "core",
        "tools",
        "multimodal",
        "multiagent",
    ),  # L1: the Env API (multimodal: observations with images; multiagent: several agents); tools and the tool factory
    ("registry", "wrappers", "grading"),  # L2
    ("vector",),  # L3: the ray mode is named by its entry point, not imported
    ("ray", "rollout"),  # L4: the only place that imports ray is gem_core.ray
    ("tasks", "dataset_rows", "batch", "plugins", "experiment_scripts"),  # L5 (experiment_scripts: what the plugins' experiment writers share)
    ("envs",),  # L6
    ("__init__", "eval", "train", "testing", "serve", "play"),  # L7: the package's face (it registers envs/) and the jobs
    ("cli",),  # L8: the gem-core command
]
LAYER = {name: level for level, names in enumerate(LAYERS) for name in names}
INTEGRATIONS_LAYER = LAYER["eval"]  # the trainer plugins stand beside the jobs: never below what they use


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "integrations":
        parts[0] = "gem_integrations"
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(name: str) -> bool:
    return (ROOT / Path(*name.split("."))).is_dir()


def imports_of(path: Path, text: str | None = None) -> list[tuple[str, int]]:
    """Every gem_core module ``path`` imports (resolved to the module, not the package's face when a
    submodule is named), with its line. ``from gem_core import algo`` names the module gem_core.algo."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                source = "gem_core" if base == "gem_core" else base.replace("gem_integrations", "integrations", 1)
                is_module = (ROOT / Path(*source.split(".")) / f"{alias.name}.py").exists() or _is_package(f"{source}.{alias.name}")
                found.append((full if is_module else base, node.lineno))
    return [(m, line) for m, line in found if m == "gem_core" or m.startswith("gem_core.")]


def layer_of(module: str) -> int:
    parts = module.split(".")
    top = "__init__" if len(parts) == 1 else parts[1]
    return LAYER[top]


def sources() -> list[Path]:
    return sorted((ROOT / "gem_core").rglob("*.py")) + sorted((ROOT / "integrations").rglob("*.py"))


def test_every_top_level_module_has_a_layer():
    tops = {p.stem if p.is_file() else p.name for p in (ROOT / "gem_core").iterdir() if (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert tops - set(LAYER) == set(), "name the new module's layer in LAYERS"


def upward_imports(texts: dict[Path, str] | None = None) -> list[str]:
    """``path:line: ...`` for each import of a higher layer (``texts``: a file's text to check instead)."""
    found = []
    for path in sources():
        name = _module_name(path)
        mine = INTEGRATIONS_LAYER if name.startswith("gem_integrations") else layer_of(name)
        for target, line in imports_of(path, (texts or {}).get(path)):
            if layer_of(target) > mine:
                found.append(f"{path.relative_to(ROOT)}:{line}: L{mine} imports {target} (L{layer_of(target)})")
    return found


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports() == []


def test_the_contract_fails_on_an_upward_import():
    """The check itself can fail: a registry that imports the vector package, even inside a function, or
    a core that takes a name from the registry, is reported."""
    registry, core = ROOT / "gem_core" / "registry.py", ROOT / "gem_core" / "core.py"
    texts = {
        registry: registry.read_text() + "\n\ndef _late():\n    from gem_core.vector import make_vec\n",
        core: core.read_text() + "\nfrom gem_core import registry\n",
    }
    found = upward_imports(texts)
    assert any(v.startswith("gem_core/registry.py:") and "imports gem_core.vector (L3)" in v for v in found)
    assert any(v.startswith("gem_core/core.py:") and "imports gem_core.registry (L2)" in v for v in found)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {t for t, _ in imports_of(path) if t in modules and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def product_imports_of_testing(texts: dict[Path, str] | None = None) -> list[str]:
    """``path:line`` of each product module (gem_core outside testing/, the plugins) that imports gem_core.testing:
    test machinery stays out of what users run (``--model tiny`` builds from gem_core.tiny)."""
    found = []
    for path in sources():
        if _module_name(path).startswith("gem_core.testing"):
            continue
        for target, line in imports_of(path, (texts or {}).get(path)):
            if target == "gem_core.testing" or target.startswith("gem_core.testing."):
                found.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    return found


def test_no_product_module_imports_the_test_machinery():
    assert product_imports_of_testing() == []


def test_the_test_machinery_check_fails_on_such_an_import():
    run = ROOT / "gem_core" / "train" / "run.py"
    text = run.read_text() + "\n\ndef _f():\n    from gem_core.testing import FakeChatServer\n"
    assert any(f.startswith("gem_core/train/run.py:") for f in product_imports_of_testing({run: text}))


def test_no_modules_import_each_other_in_a_circle():
    assert circles(_graph()) == []


def test_the_circle_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_plugins_use_the_runner_through_its_public_names():
    """A trainer plugin plays rows with ``gem_core.rollout``'s public names (``play_row`` and the policies),
    never a module inside it (the runner's private helpers may change)."""
    inside = [
        f"{path.relative_to(ROOT)}:{line}: {target}"
        for path in sorted((ROOT / "integrations").rglob("*.py"))
        for target, line in imports_of(path)
        if target.startswith("gem_core.rollout.")
    ]
    assert inside == []
