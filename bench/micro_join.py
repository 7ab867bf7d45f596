"""Predicted (bench/sass_model.py --json) beside measured (bench/gpu_micro.py) kernel by kernel, joined on
(kernel, role, rows, dtype); a measured call launching several kernels matches each of them. Rows on either
side without a partner are listed, not dropped."""
from __future__ import annotations


def _key(r: dict) -> tuple:
    return (str(r.get("role")), int(r.get("rows", -1)), str(r.get("dtype")))


def join_lines(predicted: list[dict], measured: list[dict]) -> list[str]:
    lines = [f"{'kernel':<28} {'role':<7} {'rows':>5} {'dtype':<6} {'predicted_us':>12} {'measured_us':>11} "
             f"{'meas/pred':>9}  bound"]
    used: set[int] = set()
    for m in measured:
        names = set(m["kernel"].split(",")) | {m.get("form", "")}
        hits = [(i, p) for i, p in enumerate(predicted) if p.get("kernel") in names and _key(p) == _key(m)]
        if not hits:
            lines.append(f"{m['kernel'][:28]:<28} {m['role']:<7} {m['rows']:>5} {m['dtype']:<6} {'-':>12} "
                         f"{m['measured_us']:>11.1f} {'-':>9}  (no prediction)")
            continue
        pred = sum(float(p.get("predicted_us", 0.0)) for _, p in hits)
        used.update(i for i, _ in hits)
        ratio = m["measured_us"] / pred if pred > 0 else float("nan")
        bound = "+".join(str(p.get("bound", "?")) for _, p in hits)
        lines.append(f"{m['kernel'][:28]:<28} {m['role']:<7} {m['rows']:>5} {m['dtype']:<6} {pred:>12.1f} "
                     f"{m['measured_us']:>11.1f} {ratio:>9.2f}  {bound}")
    for i, p in enumerate(predicted):
        if i not in used:
            lines.append(f"{str(p.get('kernel'))[:28]:<28} {str(p.get('role')):<7} {p.get('rows', '?'):>5} "
                         f"{str(p.get('dtype')):<6} {float(p.get('predicted_us', 0.0)):>12.1f} {'-':>11} {'-':>9}  "
                         f"{p.get('bound', '?')} (not measured)")
    return lines
