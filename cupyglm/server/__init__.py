"""The OpenAI-compatible HTTP server of rank 0: app (starlette routes), the wire format (requests, messages, fields,
unsupported, responses, sse, errors), bridge (asyncio <-> the engine thread), metrics (Prometheus). Launched by
`cupyglm-serve` (cupyglm.cli.serve)."""
