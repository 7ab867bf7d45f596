"""Checkpoints: the split table (names), the zero-copy loader, the tokenizer and the tiny checkpoint.

Exports resolve lazily so that `import cupyglm.checkpoint.names` stays light.
"""
from __future__ import annotations

_EXPORTS = {
    "Checkpoint": "loader", "CheckpointError": "loader", "open_model": "loader", "SafetensorsFile": "loader",
    "write_safetensors": "loader",
    "Tokenizer": "tokenizer", "IncrementalDecoder": "incremental_decoder", "ChatTemplateError": "chat_template",
    "default_tiny_dir": "tiny", "write_tiny": "tiny", "tiny_tensors": "tiny",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
