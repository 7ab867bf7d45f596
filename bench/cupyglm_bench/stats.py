"""Statistics as vLLM's `bench serve` computes them (numpy: linear-interpolated percentiles, population std)."""
from __future__ import annotations

import numpy as np

METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = (99.0,)


def median(values):
    """Median of the non-None values; None when there are none."""
    vals = [v for v in values if v is not None]
    return float(np.median(vals)) if vals else None


def mean(values) -> float:
    """vLLM: np.mean(values or 0), so an empty list gives 0.0."""
    return float(np.mean(list(values) or 0))


def std(values) -> float:
    """Population standard deviation (numpy's default ddof=0, as vLLM)."""
    return float(np.std(list(values) or 0))


def percentile(values, p: float) -> float:
    return float(np.percentile(list(values) or 0, p))


def percentile_word(p: float) -> str:
    """vLLM's key spelling: 99 -> '99', 99.9 -> '99.9'."""
    return str(int(p)) if int(p) == p else str(p)


def metric_summary(name: str, values_s, percentiles=DEFAULT_PERCENTILES) -> dict:
    """`mean_<m>_ms, median_<m>_ms, std_<m>_ms, p<P>_<m>_ms` from values in seconds."""
    ms = [v * 1000.0 for v in values_s]
    out = {
        f"mean_{name}_ms": mean(ms),
        f"median_{name}_ms": float(np.median(ms or 0)),
        f"std_{name}_ms": std(ms),
    }
    for p in percentiles:
        out[f"p{percentile_word(p)}_{name}_ms"] = percentile(ms, p)
    return out


def parse_percentiles(text: str | None) -> list[float]:
    """`--percentiles 50,90,99` -> [50.0, 90.0, 99.0]; 99 is always included (vLLM's default key)."""
    ps = {99.0}
    if text:
        for part in text.split(","):
            part = part.strip()
            if part:
                p = float(part)
                if not 0 < p <= 100:
                    raise ValueError(f"percentile {part} is not in (0, 100]")
                ps.add(p)
    return sorted(ps)
