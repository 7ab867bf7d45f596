"""bench/fidelity_hf.py's arithmetic on plain arrays (no torch): how far cupyglm's values are from a reference's,
the first greedy split, the image placeholders, and the one SUMMARY line."""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class PromptResult:
    name: str
    kind: str                      # "text" or "image"
    max_logit_diff: float          # max |cupyglm - reference| over every prompt row's logits
    agree: list[bool]              # per prompt row: argmax equal
    ref_ids: list[int]             # the reference's greedy tokens
    ids: list[int]                 # cupyglm's greedy tokens
    sublayers: list[tuple[str, float, float]]   # (tap, max |difference|, max |reference|) in forward order
    routes: list[tuple[str, list[int]]] = dataclasses.field(default_factory=list)   # (MoE layer, rows routed apart)

    @property
    def split(self) -> int | None:
        return first_divergence(self.ref_ids, self.ids)


def result(name: str, kind: str, ref: tuple, got: tuple) -> PromptResult:
    """ref, got: one side's run of a prompt each, (prompt logits [n, V], {tap: array}, {MoE layer: [n, k] expert
    ids}, greedy ids) -> how far `got` is from `ref`."""
    (ref_logits, ref_taps, ref_routes, ref_ids), (logits, taps, routes, ids) = ref, got
    return PromptResult(name, kind, max_abs_diff(ref_logits, logits), argmax_agreement(ref_logits, logits),
                        list(ref_ids), list(ids), sublayer_diffs(ref_taps, taps), route_splits(ref_routes, routes))


def max_abs_diff(ref, got) -> float:
    """max |got - ref| in float64 (shapes must agree); NaN anywhere gives inf, so it never reads as close."""
    a, b = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: reference {a.shape}, cupyglm {b.shape}")
    if a.size == 0:
        return 0.0
    d = np.abs(a - b)
    return float("inf") if np.isnan(d).any() else float(d.max())


def argmax_agreement(ref_logits, logits) -> list[bool]:
    """Per row of [rows, vocab] logits: the argmax (ties to the lower id, as greedy sampling takes) is equal."""
    a, b = np.asarray(ref_logits), np.asarray(logits)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: reference {a.shape}, cupyglm {b.shape}")
    return [bool(x) for x in np.argmax(a, axis=-1) == np.argmax(b, axis=-1)]


def first_divergence(ref_ids, ids) -> int | None:
    """The first step where two greedy runs chose different tokens (a shorter run splits where it ends);
    None when they are equal."""
    for i, (a, b) in enumerate(zip(ref_ids, ids)):
        if int(a) != int(b):
            return i
    return None if len(ref_ids) == len(ids) else min(len(ref_ids), len(ids))


def sublayer_diffs(ref_taps: dict, taps: dict) -> list[tuple[str, float, float]]:
    """(name, max |difference|, max |reference|: the scale bf16 rounds at) for each tap both sides recorded, in the
    reference's order."""
    return [(name, max_abs_diff(ref, taps[name]), max_abs_diff(np.zeros_like(ref), ref))
            for name, ref in ref_taps.items() if name in taps]


def route_splits(ref_routes: dict, routes: dict) -> list[tuple[str, list[int]]]:
    """Per MoE layer both sides recorded ([rows, k] expert ids each): the rows whose chosen expert sets differ."""
    out = []
    for name, ref in ref_routes.items():
        if name in routes:
            a, b = np.sort(np.asarray(ref), -1), np.sort(np.asarray(routes[name]), -1)
            out.append((name, [int(r) for r in np.nonzero((a != b).any(-1))[0]]))
    return out


def expand_image(ids, image_id: int, n_tokens: list[int]) -> list[int]:
    """Each single image placeholder (as the chat template writes it) repeated to its image's token count, in
    order; the count of placeholders must equal the number of images."""
    out, k = [], 0
    for t in ids:
        if int(t) == image_id:
            if k == len(n_tokens):
                raise ValueError(f"more image placeholders than images ({len(n_tokens)})")
            out += [image_id] * n_tokens[k]
            k += 1
        else:
            out.append(int(t))
    if k != len(n_tokens):
        raise ValueError(f"{k} image placeholders for {len(n_tokens)} images")
    return out


def sublayer_lines(r: PromptResult, tol: float, floor: PromptResult | None = None) -> list[str]:
    """One line for each tap whose difference exceeds `tol` (where the two sides differ), beside the floor's
    difference at that tap when there is a floor (another run measured against the same reference)."""
    theirs = {name: d for name, d, _ in floor.sublayers} if floor else {}
    return [f"  {name:<12} max|d| {d:.3e}" + (f"  floor {theirs[name]:.3e}" if name in theirs else "") +
            f"  (max|ref| {scale:.3e})" for name, d, scale in r.sublayers if d > tol]


def summary(results: list[PromptResult], steps: int, floors: list[PromptResult] | None = None,
            floor_label: str = "floor") -> str:
    """One line over every prompt: worst logit difference, argmax agreement, routing, greedy splits; then the same
    figures of the floor runs when there are some."""
    kinds = {k: sum(r.kind == k for r in results) for k in ("text", "image")}
    line = (f"SUMMARY {len(results)} prompts ({kinds['text']} text, {kinds['image']} image) over {steps} greedy "
            f"steps: {figures(results)}")
    return line + (f"; {floor_label}: {figures(floors)}" if floors else "")


def figures(results: list[PromptResult]) -> str:
    """Worst logit difference, argmax agreement, (MoE layer, row) pairs routed apart, greedy splits."""
    agree = sum(sum(r.agree) for r in results)
    rows = sum(len(r.agree) for r in results)
    worst = max((r.max_logit_diff for r in results), default=0.0)
    routed = sum(len(rows) for r in results for _, rows in r.routes)
    splits = [(r.name, r.split) for r in results if r.split is not None]
    split = ("no greedy split" if not splits else
             f"greedy split in {len(splits)} ({', '.join(f'{n} at step {s}' for n, s in splits)})")
    return (f"max |logit diff| {worst:.3e}, argmax agree {agree}/{rows} positions, {routed} (MoE layer, row) pairs "
            f"routed apart, {split}")
