"""cupyglm (numpy backend) against Hugging Face transformers' glm5_next (fp32, the reference) on one checkpoint.

    /work/hfvenv/bin/python bench/fidelity_hf.py [--model DIR] [--steps 16] [--image FILE ...] [--no-images]

Run by hand in a Python that has torch and transformers (with models/glm5_next) beside cupyglm; never part of
launch/test. The default checkpoint is the built-in tiny one. Both sides get the same prompt token ids (text
prompts, and with a tower, image prompts whose placeholder ids each side fills with its own processor and tower's
rows; cupyglm through its model's image input, SeqInput.embeds, as its engine passes them). Per prompt it prints
the max |logit difference| over every prompt row, argmax agreement per position, the first split of N greedy
steps (each side feeding its own tokens), each tap where the two differ (tower rows, embeddings, every layer's
4 streams, final norm, logits) and the rows each MoE layer routes to other experts; beside each figure the
floor: transformers' own bfloat16 run against the same fp32 reference (what bf16 arithmetic alone moves on this
checkpoint). Then one SUMMARY line.
"""
from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import fidelity_stats as fs  # noqa: E402
from bench.fidelity_ours import Ours  # noqa: E402
from bench.token_sha import PROMPTS  # noqa: E402
from cupyglm.checkpoint.loader import open_model  # noqa: E402
from cupyglm.vision.processor import ProcessorConfig  # noqa: E402

CHAT = "def fib(n):"
IMAGE_TEXT = "What is in the picture?"
IMAGE_PART = "<|begin_of_image|><|image|><|end_of_image|>"     # the chat template's image part, as text
FLOOR = "floor (transformers bf16)"                               # the same reference's distance to its own bf16 run
SYNTHETIC_IMAGES = {"image112": (112, 112, "PNG"), "image_wide": (150, 260, "JPEG")}   # 16 and 60 image tokens


def need_hf():
    """(torch, Glm5NextForConditionalGeneration, Glm5NextImageProcessorPil), or exit with what is missing."""
    try:
        import torch
        from transformers.models.glm5_next import modeling_glm5_next
        from transformers.models.glm5_next.image_processing_pil_glm5_next import Glm5NextImageProcessorPil
    except ImportError as e:
        sys.exit(f"fidelity_hf: needs torch and transformers with models/glm5_next ({e}); install them into a "
                 "separate venv (see README, 'Fidelity against transformers') and run it with that venv's python")
    return torch, modeling_glm5_next.Glm5NextForConditionalGeneration, Glm5NextImageProcessorPil


class Theirs:
    """transformers' Glm5NextForConditionalGeneration on the CPU in `dtype`, with hooks that record the taps."""

    def __init__(self, path: Path, dtype: str):
        self.torch, model_cls, proc_cls = need_hf()
        self.model = model_cls.from_pretrained(path, dtype=getattr(self.torch, dtype)).eval()
        self.processor = proc_cls.from_pretrained(path) if (path / "preprocessor_config.json").is_file() else None
        self.taps: dict | None = None
        self.routes: dict = {}
        lm = self.model.model.language_model
        lm.register_forward_pre_hook(self._embed_hook, with_kwargs=True)
        for i, layer in enumerate(lm.layers):
            layer.register_forward_hook(self._tap(f"layer{i}", lambda out: out[0][0]))
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.register_forward_hook(self._route(f"layer{i}"))
        lm.norm.register_forward_hook(self._tap("norm", lambda out: out[0]))
        self.model.model.visual.register_forward_hook(self._tap("tower", lambda out: out.pooler_output))

    def _tap(self, name: str, pick):
        def hook(_module, _args, out):
            if self.taps is not None:
                self.taps[name] = pick(out).detach().float().numpy()
        return hook

    def _route(self, name: str):
        def hook(_module, _args, out):
            if self.taps is not None:
                self.routes[name] = out[2].detach().numpy()
        return hook

    def _embed_hook(self, _module, _args, kwargs):
        if self.taps is not None:
            self.taps["embed"] = kwargs["inputs_embeds"][0].detach().float().numpy()

    def image(self, data: bytes):
        """Encoded bytes -> transformers' processor output (pixel_values, image_grid_thw) as numpy."""
        from PIL import Image

        out = self.processor(Image.open(io.BytesIO(data)), return_tensors="np")
        return np.asarray(out["pixel_values"]), np.asarray(out["image_grid_thw"])

    def run(self, ids: list[int], steps: int, image=None):
        """The prompt's every-row logits, the taps, the MoE layers' expert ids and `steps` greedy tokens (each step a
        full forward, no cache)."""
        torch = self.torch
        extra = {}
        if image is not None:
            extra = {"pixel_values": torch.from_numpy(image[0]), "image_grid_thw": torch.from_numpy(image[1])}
        seq, out_ids, logits, taps = list(ids), [], None, None
        with torch.no_grad():
            for step in range(steps):
                self.taps, self.routes = ({}, {}) if step == 0 else (None, self.routes)
                lg = self.model(input_ids=torch.tensor([seq]), **extra).logits[0].float().numpy()
                if step == 0:
                    logits, taps = lg, self.taps
                    taps["logits"] = lg
                out_ids.append(int(np.argmax(lg[-1])))
                seq.append(out_ids[-1])
        self.taps = None
        return logits, taps, self.routes, out_ids


def synthetic_image(h: int, w: int, fmt: str) -> bytes:
    """A deterministic picture (a colour gradient under noise) encoded as `fmt`."""
    from PIL import Image

    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) % 256], -1)
    noise = np.random.default_rng(h * 1000 + w).integers(0, 48, (h, w, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(rgb + noise, 0, 255).astype(np.uint8)).save(buf, fmt)
    return buf.getvalue()


def prompts(ckpt, images: dict[str, bytes]) -> list[tuple[str, list[int], bytes | None]]:
    """(name, token ids with one placeholder an image, image bytes or None)."""
    tok = ckpt.tokenizer
    chat = lambda text: tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))  # noqa: E731
    out = [("mid", PROMPTS["mid"], None), ("long", PROMPTS["long"], None), ("chat", chat(CHAT), None)]
    return out + [(name, chat(IMAGE_PART + IMAGE_TEXT), data) for name, data in images.items()]


def compare(name: str, ids, data, ours, theirs, floor, steps: int):
    """One prompt through each side -> (cupyglm's result, the floor's result or None) against `theirs`; for an
    image each side runs its own processor and tower."""
    rows = hf_image = None
    if data is not None:
        pixels, grid, n_tokens, rows = ours.image(data)
        hf_image = theirs.image(data)
        print(f"{name}: grid {grid}, {n_tokens} image tokens; processor max|d| "
              f"{fs.max_abs_diff(hf_image[0], pixels):.3e}, grid equal {hf_image[1].tolist() == [list(grid)]}")
        ids = fs.expand_image(ids, ours.cfg.vision.image_token_id, [n_tokens])
    kind = "text" if data is None else "image"
    ref = theirs.run(ids, steps, hf_image)
    logits, taps, routes, got_ids = ours.run(ids, steps, rows)
    taps = taps if rows is None else {"tower": np.asarray(rows, np.float32), **taps}
    base = None if floor is None else fs.result(name, kind, ref, floor.run(ids, steps, hf_image))
    return fs.result(name, kind, ref, (logits, taps, routes, got_ids)), base


def show(r: fs.PromptResult, floor: fs.PromptResult | None, tol: float) -> None:
    print(f"{r.name} [{r.kind}, {len(r.agree)} rows]: {verdict(r)}")
    if floor is not None:
        print(f"  {FLOOR}: {verdict(floor)}")
    for line in fs.sublayer_lines(r, tol, floor):
        print(line)
    routed = dict(floor.routes) if floor else {}
    for name, rows in r.routes:
        if rows or routed.get(name):
            apart = f"; floor {len(routed[name])} rows" if name in routed else ""
            print(f"  {name:<12} experts chosen apart in {len(rows)}/{len(r.agree)} rows: {rows}{apart}")


def verdict(r: fs.PromptResult) -> str:
    marks = "".join("+" if a else "x" for a in r.agree)
    split = "none" if r.split is None else f"step {r.split} (reference {r.ref_ids[r.split:r.split + 4]} vs " \
                                           f"{r.ids[r.split:r.split + 4]})"
    return (f"max|logit d| {r.max_logit_diff:.3e}; argmax agree {sum(r.agree)}/{len(r.agree)} {marks}; first greedy "
            f"split over {len(r.ref_ids)} steps: {split}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint directory (default: the built-in tiny checkpoint)")
    p.add_argument("--steps", type=int, default=16, help="greedy steps per prompt")
    p.add_argument("--image", action="append", default=[], help="an image file for an image prompt (repeatable)")
    p.add_argument("--no-images", action="store_true", help="text prompts only")
    p.add_argument("--hf-dtype", default="float32", choices=("float32", "bfloat16"),
                   help="transformers' weights and activations (float32: the reference)")
    p.add_argument("--no-floor", action="store_true",
                   help="skip the floor: transformers in bfloat16 against the same fp32 reference")
    p.add_argument("--tol", type=float, default=0.0, help="print the taps whose max |difference| exceeds this")
    a = p.parse_args()
    if a.steps < 1:
        p.error("--steps must be at least 1")
    need_hf()
    ckpt = open_model(a.model)
    if a.image and ckpt.config.vision is None:
        p.error(f"{ckpt.path} has no vision tower: --image needs one")
    images = {}
    if not a.no_images and ckpt.config.vision is not None:
        images = {Path(f).name: Path(f).read_bytes() for f in a.image} or \
            {name: synthetic_image(*spec) for name, spec in SYNTHETIC_IMAGES.items()}
    theirs = Theirs(Path(ckpt.path), a.hf_dtype)
    floor = None if a.no_floor or a.hf_dtype != "float32" else Theirs(Path(ckpt.path), "bfloat16")
    todo = prompts(ckpt, images)
    image_room = ProcessorConfig.from_dir(ckpt.path).max_image_tokens if images else 0
    ours = Ours(ckpt, max(len(ids) for _, ids, _ in todo) + image_room + a.steps)
    pairs = [compare(name, ids, data, ours, theirs, floor, a.steps) for name, ids, data in todo]
    for r, f in pairs:
        show(r, f, a.tol)
    floors = [f for _, f in pairs if f is not None]
    print(fs.summary([r for r, _ in pairs], a.steps, floors, FLOOR))


if __name__ == "__main__":
    main()
