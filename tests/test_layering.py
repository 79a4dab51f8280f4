"""pipelines/ -> components/ -> trainer/, one direction; compiling never imports torch."""

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_trainer_never_imports_kfp_components_or_pipelines():
    for path in (REPO / "trainer").rglob("*.py"):
        bad = imported_modules(path) & {"kfp", "components", "pipelines"}
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_components_never_import_pipelines():
    for path in (REPO / "components").rglob("*.py"):
        assert "pipelines" not in imported_modules(path), path


def test_compiling_every_pipeline_imports_no_torch(tmp_path):
    code = (
        "import sys\n"
        "from pipelines.compile import compile_all\n"
        f"compile_all({str(tmp_path)!r})\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'sklearn'))\n"
        "assert not heavy, heavy\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_trainer_imports_without_kfp_installed():
    """Hide kfp entirely: the whole trainer package still imports (it runs in bare pods)."""
    code = (
        "import sys, pkgutil, importlib\n"
        "sys.modules['kfp'] = None\n"
        "import trainer\n"
        "for m in pkgutil.walk_packages(trainer.__path__, 'trainer.'):\n"
        "    importlib.import_module(m.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def _module_level_imports(path: Path, known: set[str]) -> set[str]:
    """The trainer modules `path` imports when it is imported (not inside functions)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in names if n in known}


def test_trainer_has_no_import_cycle():
    """No trainer module imports, at module level, one that imports it back (directly or not)."""
    modules = {}
    for path in (REPO / "trainer").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: _module_level_imports(path, set(modules)) - {name} for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, stack: list[str]) -> None:
        if name in stack:
            raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(name) :], name]))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*stack, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_names_the_compiled_components_import_still_exist():
    """Compiled component YAML embeds each component's body, imports included: the image must
    serve every trainer name those published files import."""
    import importlib
    import re

    import yaml

    def strings(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from strings(v)
        elif isinstance(node, list):
            for v in node:
                yield from strings(v)

    found = set()
    for path in (REPO / "compiled").rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            for text in strings(doc):
                for module, names in re.findall(r"from (trainer[\w.]*) import ([\w, ]+)", text):
                    found |= {(module, n.split(" as ")[0].strip()) for n in names.split(",") if n.strip()}
    assert ("trainer.pipeline_steps", "select_backend") in found and ("trainer.launch.byo", "byo_job") in found
    for module, name in sorted(found):
        assert hasattr(importlib.import_module(module), name), f"compiled YAML imports {module}.{name}"
