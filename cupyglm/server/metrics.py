"""Prometheus metrics in vLLM's shapes under the `cupyglm:` prefix, on a registry of the server's own."""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self, model_name: str = "") -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.ttft = Histogram("cupyglm:time_to_first_token_seconds", "Time to first token.",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("cupyglm:inter_token_latency_seconds", "Time between streamed tokens.",
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("cupyglm:e2e_request_latency_seconds", "Request latency, arrival to finish.",
                             buckets=_E2E_BUCKETS, registry=r)
        self.queue_time = Histogram("cupyglm:request_queue_time_seconds", "Time a request waited before its "
                                    "first step.", buckets=_E2E_BUCKETS, registry=r)
        self.running = Gauge("cupyglm:num_requests_running", "Requests being generated.", registry=r)
        self.waiting = Gauge("cupyglm:num_requests_waiting", "Requests waiting for their first token.", registry=r)
        self.kv_usage = Gauge("cupyglm:kv_cache_usage_perc", "Fraction of KV pages in use (0..1).", registry=r)
        self.kv_free = Gauge("cupyglm:kv_free_pages", "KV pages free.", registry=r)
        self.kv_total = Gauge("cupyglm:kv_total_pages", "KV pages in the pool.", registry=r)
        self.prompt_tokens = Counter("cupyglm:prompt_tokens", "Prompt tokens of admitted requests.", registry=r)
        self.generation_tokens = Counter("cupyglm:generation_tokens", "Tokens generated.", registry=r)
        self.prefix_queries = Counter("cupyglm:prefix_cache_queries", "Prompt tokens looked up in the prompt "
                                      "cache.", registry=r)
        self.prefix_hits = Counter("cupyglm:prefix_cache_hits", "Prompt tokens found in the prompt cache.",
                                   registry=r)
        self.cache_bytes = Gauge("cupyglm:prefix_cache_bytes", "Bytes of kept prompt states held (per rank).",
                                 registry=r)
        self.cache_evictions = Counter("cupyglm:prefix_cache_evictions", "Kept prompt states evicted.", registry=r)
        self.store_pages = Gauge("cupyglm:prefix_cache_kv_pages", "KV pool pages held by kept prompts "
                                 "(CUPYGLM_KV_SHARE).", registry=r)
        self._evictions_seen = 0
        self.disk_hits = Counter("cupyglm:prefix_cache_disk_hits", "Kept prompt states loaded from disk.", registry=r)
        self.disk_read = Counter("cupyglm:prefix_cache_disk_read_bytes", "Bytes of kept states read from disk "
                                 "(rank 0's shard).", registry=r)
        self.disk_written = Counter("cupyglm:prefix_cache_disk_written_bytes", "Bytes of kept state files "
                                    "written (rank 0's shard).", registry=r)
        self.disk_refused = Counter("cupyglm:prefix_cache_disk_refused", "State files refused (rank 0's), by "
                                    "reason.", ["reason"], registry=r)
        self._disk_seen: dict = {}
        self.row_hits = Gauge("cupyglm:kv_host_row_cache_hits", "KV host rows the row cache served (decode and "
                              "verify gathers, all layers, since startup).", registry=r)
        self.row_misses = Gauge("cupyglm:kv_host_row_cache_misses", "KV host rows decode and verify gathers "
                                "copied from host memory (all layers, since startup).", registry=r)
        self.row_hit_rate = Gauge("cupyglm:kv_host_row_cache_hit_rate", "Row cache hits / gathered rows.",
                                  registry=r)
        self.row_bytes = Gauge("cupyglm:kv_host_bytes_per_decode_token", "Host bytes a decode row copied "
                               "across the bus (all layers).", registry=r)
        # speculative decoding, vLLM's spec_decode names: verify calls, drafts verified, drafts accepted
        self.spec_drafts = Counter("cupyglm:spec_decode_num_drafts", "Verify calls with MTP drafts.", registry=r)
        self.spec_draft_tokens = Counter("cupyglm:spec_decode_num_draft_tokens", "MTP draft tokens verified.",
                                         registry=r)
        self.spec_accepted = Counter("cupyglm:spec_decode_num_accepted_tokens", "MTP draft tokens accepted.",
                                     registry=r)
        self.spec_per_pos = Counter("cupyglm:spec_decode_num_accepted_tokens_per_pos", "MTP draft tokens accepted "
                                    "by draft position.", ["position"], registry=r)
        self.success = Counter("cupyglm:request_success", "Finished requests by finish reason.",
                               ["finished_reason"], registry=r)
        for reason in ("stop", "length", "abort"):
            self.success.labels(finished_reason=reason)

    # -- updates, all from the event loop thread except set_pages --
    def set_pages(self, free: int, total: int) -> None:
        self.kv_free.set(free)
        self.kv_total.set(total)
        self.kv_usage.set((total - free) / total if total else 0.0)

    def set_cache(self, held_bytes: int, evictions: int) -> None:
        self.cache_bytes.set(held_bytes)
        if evictions > self._evictions_seen:
            self.cache_evictions.inc(evictions - self._evictions_seen)
            self._evictions_seen = evictions

    def set_disk(self, stats: Any) -> None:
        """Counters from the disk tier's running totals (cupyglm.kv.disk_store.DiskStats)."""
        now = {"hits": stats.hits, "read": stats.bytes_read, "written": stats.bytes_written,
               **{("refused", k): v for k, v in stats.refused.items()}}
        for key, value in now.items():
            delta = value - self._disk_seen.get(key, 0)
            if delta > 0:
                if isinstance(key, tuple):
                    self.disk_refused.labels(reason=key[1]).inc(delta)
                else:
                    {"hits": self.disk_hits, "read": self.disk_read, "written": self.disk_written}[key].inc(delta)
            self._disk_seen[key] = value
    def set_kv_host(self, stats: dict) -> None:
        """KV rows in host memory: the row cache's totals (HostRows.take_stats)."""
        hits, misses = stats["hits"], stats["misses"]
        self.row_hits.set(hits)
        self.row_misses.set(misses)
        self.row_hit_rate.set(hits / (hits + misses) if hits + misses else 0.0)
        self.row_bytes.set(stats["bytes_per_decode_token"])

    def set_counts(self, running: int, waiting: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)

    def on_arrival(self, prompt_len: int) -> None:
        self.prompt_tokens.inc(prompt_len)

    def on_first_token(self, stream: Any, queued_s: float, ttft_s: float) -> None:
        self.queue_time.observe(queued_s)
        self.ttft.observe(ttft_s)

    def on_tokens(self, stream: Any, gap_s: float, n: int) -> None:
        for _ in range(n):
            self.itl.observe(gap_s / n)

    def on_finish(self, stream: Any, reason: str, now: float, cached: int = 0) -> None:
        self.e2e.observe(max(0.0, now - stream.arrival))
        self.success.labels(finished_reason=reason).inc()
        self.prefix_queries.inc(stream.prompt_len)
        if cached:
            self.prefix_hits.inc(cached)

    def on_draft(self, proposed: int, accepted: int) -> None:
        self.spec_drafts.inc()
        self.spec_draft_tokens.inc(proposed)
        self.spec_accepted.inc(accepted)
        for pos in range(accepted):
            self.spec_per_pos.labels(position=str(pos)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
