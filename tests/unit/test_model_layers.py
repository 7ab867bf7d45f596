"""The model layer points down only (docs/architecture.md §1): no module of cupyglm/model imports the engine (where
CUDA graphs, the runner's choice of captured or eager, and the sampler live) or a layer above it, and none reaches
the host-rows path except through the KV store's interface."""
from __future__ import annotations

import ast
from pathlib import Path

import cupyglm

MODEL = Path(cupyglm.__file__).parent / "model"
ABOVE = ("cupyglm.engine", "cupyglm.server", "cupyglm.cli")


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_model_imports_nothing_above_it_nor_the_host_rows():
    files = sorted(MODEL.glob("*.py"))
    assert files
    for f in files:
        bad = {m for m in _imports(f) if m.startswith(ABOVE) or m.startswith("cupyglm.kv.host_")}
        assert not bad, f"model/{f.name} imports {sorted(bad)}"
