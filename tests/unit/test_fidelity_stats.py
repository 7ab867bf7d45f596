"""bench/fidelity_hf.py's pure helpers (no torch): differences, argmax agreement, the first greedy split, image
placeholders and the SUMMARY line."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import fidelity_stats as fs  # noqa: E402


def test_max_abs_diff_is_the_largest_gap_and_nan_is_never_close():
    ref = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    assert fs.max_abs_diff(ref, ref) == 0.0
    assert fs.max_abs_diff(ref, ref + np.array([[0, 0.25], [-0.5, 0]], np.float32)) == 0.5
    assert fs.max_abs_diff(ref, np.where(ref > 2, np.nan, ref)) == float("inf")
    with pytest.raises(ValueError, match="shapes differ"):
        fs.max_abs_diff(ref, ref[:1])


def test_argmax_agreement_per_row_ties_to_the_lower_id():
    ref = np.array([[0, 5, 1], [2, 2, 0], [9, 0, 0]], np.float32)
    got = np.array([[0, 4, 1], [1, 3, 0], [9, 0, 9]], np.float32)
    assert fs.argmax_agreement(ref, got) == [True, False, True]


@pytest.mark.parametrize("ref, got, split", [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 9, 3], 1),
                                             ([4, 2], [1, 2], 0), ([1, 2, 3], [1, 2], 2)])
def test_first_divergence(ref, got, split):
    assert fs.first_divergence(ref, got) == split


def test_expand_image_repeats_each_placeholder_to_its_images_count():
    assert fs.expand_image([5, 9, 6, 9, 7], 9, [2, 3]) == [5, 9, 9, 6, 9, 9, 9, 7]
    with pytest.raises(ValueError, match="1 image placeholders for 2 images"):
        fs.expand_image([5, 9], 9, [2, 3])
    with pytest.raises(ValueError, match="more image placeholders"):
        fs.expand_image([9, 9], 9, [2])


def test_sublayer_diffs_in_the_references_order_and_lines_only_where_they_differ():
    ref = {"embed": np.zeros(2), "layer0": np.array([1.0, -3.0]), "norm": np.ones(2)}
    got = {"norm": np.ones(2), "layer0": np.array([1.0, -2.5]), "embed": np.zeros(2), "extra": np.zeros(1)}
    diffs = fs.sublayer_diffs(ref, got)
    assert diffs == [("embed", 0.0, 0.0), ("layer0", 0.5, 3.0), ("norm", 0.0, 1.0)]
    r = fs.PromptResult("p", "text", 0.0, [], [], [], diffs)
    assert [line.split()[0] for line in fs.sublayer_lines(r, 0.0)] == ["layer0"]
    assert fs.sublayer_lines(r, 0.5) == []
    floor = fs.PromptResult("p", "text", 0.0, [], [], [], [("layer0", 0.25, 3.0)])
    assert fs.sublayer_lines(r, 0.0, floor) == [
        "  layer0       max|d| 5.000e-01  floor 2.500e-01  (max|ref| 3.000e+00)"]


def test_route_splits_compare_expert_sets_per_row():
    ref = {"layer3": np.array([[3, 6], [1, 2], [0, 7]]), "layer4": np.array([[1, 2]])}
    got = {"layer3": np.array([[3, 5], [2, 1], [0, 7]]), "layer4": np.array([[2, 1]])}
    assert fs.route_splits(ref, got) == [("layer3", [0]), ("layer4", [])]


def test_result_measures_got_against_ref():
    ref = (np.array([[0.0, 1.0], [2.0, 0.0]]), {"embed": np.ones(2)}, {"layer3": np.array([[0, 1], [1, 2]])}, [1, 2])
    got = (np.array([[0.0, 1.5], [0.0, 2.0]]), {"embed": np.ones(2)}, {"layer3": np.array([[1, 0], [1, 3]])}, [1, 3])
    r = fs.result("p", "text", ref, got)
    assert (r.max_logit_diff, r.agree, r.split, r.routes) == (2.0, [True, False], 1, [("layer3", [1])])
    assert r.sublayers == [("embed", 0.0, 1.0)]


def test_summary_counts_prompts_positions_and_splits():
    a = fs.PromptResult("mid", "text", 0.01, [True, True, False], [1, 2, 3], [1, 2, 3], [])
    b = fs.PromptResult("img", "image", 0.03, [True], [1, 2, 3], [1, 5, 3], [], [("layer3", [0]), ("layer4", [])])
    line = fs.summary([a, b], 3)
    assert line == ("SUMMARY 2 prompts (1 text, 1 image) over 3 greedy steps: max |logit diff| 3.000e-02, argmax "
                    "agree 3/4 positions, 1 (MoE layer, row) pairs routed apart, greedy split in 1 (img at step 1)")
    assert "no greedy split" in fs.summary([a], 3)
    assert fs.summary([a], 3, [a], "bf16").endswith("; bf16: max |logit diff| 1.000e-02, argmax agree 2/3 positions, "
                                                    "0 (MoE layer, row) pairs routed apart, no greedy split")
