"""cupyglm: a tensor-parallel serving runtime for GLM-5.3-Flash-class models.

`LLM` and `SamplingParams` (the offline API) resolve lazily, so `import cupyglm` stays light.
"""
from __future__ import annotations

_EXPORTS = {
    "LLM": "cupyglm.engine.llm",
    "Completion": "cupyglm.engine.llm",
    "SamplingParams": "cupyglm.engine.sampling",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
