"""The OpenAI-compatible HTTP server of rank 0: app (starlette routes), protocol (OpenAI schemas, SSE, errors),
bridge (asyncio <-> the engine thread), metrics (Prometheus). Launched by `cupyglm-serve` (cupyglm.cli.serve)."""
