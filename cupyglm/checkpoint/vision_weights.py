"""The vision tower's tensors of an open checkpoint, by their names under names.VISION_PREFIX (whole, replicated):
what cupyglm.vision.tower.VisionTower takes."""
from __future__ import annotations

import numpy as np

from cupyglm.checkpoint import names


def vision_weights(ckpt) -> dict[str, np.ndarray]:
    """{name without "model.visual.": array} for every tower tensor the split table lists (none when the
    config has no tower)."""
    return {s.name[len(names.VISION_PREFIX):]: ckpt.tensor(s.name) for s in names.vision_specs(ckpt.config)}
