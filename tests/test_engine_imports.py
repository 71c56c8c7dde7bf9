"""The engine imports no torch (nor transformers): every module under ratchet/engine imports
with torch made unimportable, and no import anywhere in them (functions included), followed
through ratchet, reaches it. The weights come in as NumPy arrays or through DLPack."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "ratchet" / "engine"
FORBIDDEN = ("torch", "transformers")

# Run in a fresh interpreter: torch and transformers blocked (None in sys.modules makes any
# import of them raise), CuPy replaced by a stub where it is not installed (the CUDA modules
# only touch it inside functions), then every module under ratchet.engine imported.
IMPORT_ALL = f"""
import importlib, json, pkgutil, sys, types
for name in {FORBIDDEN!r}:
    sys.modules[name] = None
try:
    import cupy  # noqa: F401
except ImportError:
    class Anything:
        def __getattr__(self, name):
            return Anything()

        def __call__(self, *args, **kwargs):
            return Anything()

    stub = types.ModuleType("cupy")
    stub.__getattr__ = lambda name: Anything()
    sys.modules["cupy"] = stub
import ratchet.engine
names = ["ratchet.engine"] + sorted(m.name for m in pkgutil.walk_packages(ratchet.engine.__path__, "ratchet.engine."))
for name in names:
    importlib.import_module(name)
print(json.dumps(names))
"""


def test_every_engine_module_imports_with_torch_unimportable():
    out = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    imported = set(json.loads(out.stdout))
    on_disk = {_module_name(p) for p in ENGINE.rglob("*.py")}
    assert imported == on_disk, sorted(on_disk ^ imported)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_file(name: str) -> Path | None:
    """The file of a module of this checkout (a package's __init__.py), or None."""
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(path: Path) -> set[str]:
    """Every module an import statement in the file names (at any depth, so lazy imports
    count), with `from a import b` also as a.b where b is a module."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if _module_file(f"{base}.{alias.name}"))
    return found


def forbidden_import_chains(start: Path = ENGINE) -> list[list[str]]:
    """For every forbidden module reachable from the files under `start`: the chain of modules
    (within ratchet) that leads to it."""
    chains, seen = [], set()
    todo = [[_module_name(p)] for p in sorted(start.rglob("*.py"))]
    while todo:
        chain = todo.pop()
        name = chain[-1]
        if name in seen:
            continue
        seen.add(name)
        for target in sorted(_imports(_module_file(name))):
            if target.split(".")[0] in FORBIDDEN:
                chains.append(chain + [target])
            elif target.split(".")[0] == "ratchet" and _module_file(target) is not None:
                parts = target.split(".")  # importing a.b.c runs a/__init__ and a/b/__init__ too
                todo.extend(chain + [".".join(parts[:i])] for i in range(1, len(parts) + 1)
                            if _module_file(".".join(parts[:i])))
    return chains


def test_no_import_in_the_engine_reaches_torch():
    chains = forbidden_import_chains()
    assert not chains, "\n".join(" -> ".join(c) for c in chains)


def test_engine_imports_no_torch():
    code = ("import sys, ratchet.engine.engine, ratchet.engine.numpy.backend; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
