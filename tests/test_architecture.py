"""The house rules, checked: no import cycles among app/, engine/ and models/ (function-local imports included),
dependencies pointing app -> models -> engine, and a runtime that never imports recipes, exporters or
developer benchmarks."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"engine": 0, "models": 1, "app": 2}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return "leapvox." + ".".join(parts)


def _imports(path: Path, name: str) -> set[str]:
    """Every leapvox module `path` imports, at any depth of the file (functions included)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("leapvox.")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.startswith("leapvox."):
                out.add(base)
                out |= {f"{base}.{a.name}" for a in node.names}  # `from pkg import module`
    return out


def import_graph() -> dict[str, set[str]]:
    files = [p for layer in LAYERS for p in (ROOT / layer).rglob("*.py")]
    names = {_module_name(p): p for p in files}
    return {n: {m for m in _imports(p, n) if m in names and m != n} for n, p in names.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 60  # the walk saw the whole package
    assert cycles(graph) == []


def test_dependencies_point_app_models_engine():
    wrong = [(a, b) for a, deps in import_graph().items() for b in deps
             if LAYERS[b.split(".")[1]] > LAYERS[a.split(".")[1]]]
    assert wrong == []


def test_runtime_modules_import_no_recipes():
    """models' runtime files (everything outside models/recipes/) and engine never name a recipe or a bench."""
    graph = import_graph()
    runtime = [n for n in graph if not n.startswith(("leapvox.app", "leapvox.models.recipes"))]
    bad = [(n, d) for n in runtime for d in graph[n] if d.startswith("leapvox.models.recipes")]
    assert bad == []


# engine/nets/: the torch-only networks. engine/fast/: the fast paths applied to them from outside at load (quantized
# linears and fused projections, the compiled layer, the predictor's batch-1 loop, kernels, codec ops).
# engine/coreml/: the Core ML backend.


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for m in graph[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen


def test_networks_import_no_fast_path():
    """Quantization, fused layers, the predictor loop and compiled kernels are swapped into the networks at load;
    a network module never imports them (nor the Core ML backend), not even through another module."""
    graph = import_graph()
    nets = [n for n in graph if n.startswith("leapvox.engine.nets.")]
    fast = {n for n in graph if n.startswith(("leapvox.engine.fast", "leapvox.engine.coreml"))}
    assert len(nets) >= 8 and {"leapvox.engine.fast.quant", "leapvox.engine.fast.fused"} <= fast
    bad = {n: sorted(reachable(graph, n) & fast) for n in nets}
    assert {n: m for n, m in bad.items() if m} == {}


RUNTIME_SCRIPT = r"""
import sys
from leapvox.app.cli import main
assert "torch" not in sys.modules, "the dispatcher imported torch"
out = sys.argv[1]
for cmd in (["speak", "Two sentences. Here.", "-o", out + "/a.wav", "--mode", "spec", "-q", "--max-frames", "3"],
            ["compare", "Hi.", "--out", out + "/c", "--max-frames", "2"], ["models", "list"], ["speakers"]):
    assert main(cmd) == 0, cmd
import leapvox.app.tui.app  # the TUI's module too
bad = sorted(m for m in sys.modules if m.startswith(("leapvox.models.recipes", "leapvox.app.recipes", "tests"))
             or "coreml_export" in m or m.endswith(("bench_official", ".bench")) and "leapvox.app.bench" != m)
print("BAD", bad)
"""


def test_speaking_imports_no_recipes_exporters_or_benchmarks(tmp_path):
    p = subprocess.run([sys.executable, "-c", RUNTIME_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "BAD []" in p.stdout, p.stdout


def test_a_normal_install_carries_every_package_and_the_kernel_sources(tmp_path):
    """`pip install .` (not -e) ships every package folder of app/, engine/ and models/, the C++ sources the kernels
    are built from on first use, and the bundled demo model: the wheel is what a normal install unpacks."""
    import shutil
    import zipfile

    src = tmp_path / "src"  # a clean copy: an in-tree build would reuse whatever an earlier build left in build/
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for layer in LAYERS:
        shutil.copytree(ROOT / layer, src / layer, ignore=shutil.ignore_patterns("__pycache__"))
    wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
    done = subprocess.run([*wheel, str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    names = set(zipfile.ZipFile(next(tmp_path.glob("leapvox-*.whl"))).namelist())
    wanted = [p for layer in LAYERS for p in (ROOT / layer).rglob("*.py") if "__pycache__" not in p.parts]
    wanted += list((ROOT / "engine" / "kernels").glob("*.cpp"))
    wanted += [p for p in (ROOT / "models" / "assets").rglob("*") if p.is_file()]
    assert len(wanted) > 50  # the globs found the tree
    missing = [str(p.relative_to(ROOT)) for p in wanted if f"leapvox/{p.relative_to(ROOT).as_posix()}" not in names]
    assert not missing, f"not in the wheel: {missing[:10]}"
