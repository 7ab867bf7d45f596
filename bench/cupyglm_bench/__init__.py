"""cupyglm-bench: benchmarks and exactness checks against any OpenAI-compatible server (cupyglm, vLLM, SGLang).

Subcommands: decode, cache, concurrent, resume, load (see `cupyglm-bench SUBCOMMAND --help`).
Run without installing: `PYTHONPATH=bench python -m cupyglm_bench decode --base-url http://127.0.0.1:8000/v1`.
"""
from __future__ import annotations

SCHEMA_VERSION = 1
SUBCOMMANDS = ("decode", "cache", "concurrent", "resume", "load")
