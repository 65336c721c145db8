"""vision:Geometry-*: figures drawn from the seed, questions answered from the labels, graded by math grading."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("PIL")

import gem_core  # noqa: E402
from gem_core.envs.geometry import KINDS  # noqa: E402
from gem_core.multimodal import IMAGE_PLACEHOLDER, MultimodalObservation  # noqa: E402
from gem_core.tasks import TaskSpec  # noqa: E402


def solve(figure: dict) -> str:
    """What a reader of the labels computes: from the figure's labelled numbers only, never its answer."""
    kind, question = figure["kind"], figure["question"]
    if kind == "right_triangle":
        return str(round(math.hypot(figure["a"], figure["b"])))
    if kind == "rectangle":
        w, h = figure["w"], figure["h"]
        return str(w * h) if "area" in question else str(2 * (w + h))
    if kind == "circle":
        r = figure["r"]
        return f"\\pi {r**2}" if "area" in question else f"{2 * r} \\cdot \\pi"  # written differently from the env's
    return str(180 - figure["A"] - figure["B"])


def test_same_seed_same_pixels_other_seed_other_picture():
    a, b = gem_core.make("vision:Geometry-v0"), gem_core.make("vision:Geometry-v0")
    obs_a, _ = a.reset(seed=11)
    obs_b, _ = b.reset(seed=11)
    assert isinstance(obs_a, MultimodalObservation) and len(obs_a.images) == 1
    assert obs_a.text.count(IMAGE_PLACEHOLDER) == 1
    assert obs_a.images[0].tobytes() == obs_b.images[0].tobytes() and obs_a == obs_b
    assert obs_a.images[0].size == (256, 256) and obs_a.images[0].mode == "RGB"
    others = {a.reset(seed=s)[0].images[0].tobytes() for s in range(12)}
    assert len(others) > 6


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_is_drawn_and_the_labels_solve_it(kind):
    env = gem_core.make("vision:Geometry-v0", kind=kind, image_size=128)
    for seed in range(5):
        obs, info = env.reset(seed=seed)
        assert info["kind"] == kind and obs.images[0].size == (128, 128)
        pixels = obs.images[0].convert("L").getextrema()
        assert pixels[0] < 50 and pixels[1] == 255  # something drawn on a white canvas
        _, reward, terminated, truncated, info = env.step(f"The labels give \\boxed{{{solve(env.unwrapped.figure)}}}")
        assert (reward, terminated, truncated) == (1.0, True, False) and info["success"]


def test_wrong_answers_score_zero_and_retries_give_feedback():
    env = gem_core.make("vision:Geometry-v0-retry")
    env.reset(seed=4)
    wrong = "\\boxed{" + env.unwrapped.figure["answer"] + "1}"
    obs, reward, terminated, _, info = env.step(wrong)
    assert reward == 0.0 and not terminated and "not correct" in obs and "2 attempts left" in obs
    obs, reward, terminated, _, info = env.step("no box")
    assert reward == 0.0 and info["format_error"] and not terminated
    obs, reward, terminated, _, info = env.step(wrong)
    assert reward == 0.0 and terminated and env.unwrapped.figure["answer"] in obs and not info["success"]
    with pytest.raises(gem_core.ResetNeeded):
        env.step(wrong)
    single = gem_core.make("vision:Geometry-v0")
    single.reset(seed=4)
    assert single.step(wrong)[1:3] == (0.0, True)


def test_state_roundtrip_keeps_the_picture():
    env = gem_core.make("vision:Geometry-v0-retry")
    obs, _ = env.reset(seed=9)
    twin = env.clone()
    assert twin.unwrapped.draw().tobytes() == obs.images[0].tobytes()
    assert twin.step(env.unwrapped.oracle_action())[1] == 1.0


def test_a_dataset_row_carries_the_first_images():
    spec = TaskSpec("vision:Geometry-v0", seed=3)
    first = spec.first_observation()
    assert isinstance(first, MultimodalObservation) and len(first.images) == 1
    with pytest.raises(TypeError, match="shows images"):
        spec.first_message()


def test_list_and_eval_run_it(tmp_path, capsys):
    from gem_core.cli import main

    assert main(["list"]) == 0
    assert "vision:Geometry-v0" in capsys.readouterr().out
    out = tmp_path / "results.jsonl"
    assert main(["eval", "vision:Geometry-v0-retry", "--policy", "oracle", "--episodes", "3", "--out", str(out)]) == 0
    import json

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(row["success"] and row["error"] is None for row in rows)


def test_without_pillow_making_the_env_is_one_line(monkeypatch):
    import sys

    from gem_core.multimodal import InvalidImageError

    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL fails, as without the vision extra
    with pytest.raises(InvalidImageError, match=r"pip install -e '\.\[vision\]'"):
        gem_core.make("vision:Geometry-v0")


def test_followup_shows_the_next_figure_in_the_next_turn():
    env = gem_core.make("vision:Geometry-v0-followup", image_size=128)
    obs, _ = env.reset(seed=2)
    assert obs.text.startswith("Figure 1 of 2.\n<image>\n") and len(obs.images) == 1
    first = dict(env.unwrapped.figure)
    obs, reward, terminated, truncated, info = env.step(f"\\boxed{{{solve(first)}}}")
    assert (reward, terminated, truncated) == (1.0, False, False) and info["success"] and info["figure"] == 0
    # the next turn's observation: the feedback, then the second figure and its question
    assert isinstance(obs, MultimodalObservation) and len(obs.images) == 1 and obs.text.count(IMAGE_PLACEHOLDER) == 1
    feedback, rest = obs.text.split("\nFigure 2 of 2.\n<image>\n")
    assert "is correct" in feedback and rest.startswith(env.unwrapped.figure["question"])
    assert obs.images[0].tobytes() == env.unwrapped.draw().tobytes()
    wrong = "\\boxed{" + env.unwrapped.figure["answer"] + "1}"
    obs, reward, terminated, truncated, info = env.step(wrong)
    assert (reward, terminated, truncated) == (0.0, True, False) and not info["success"] and isinstance(obs, str)
    with pytest.raises(gem_core.ResetNeeded):
        env.step(wrong)
    # success means every figure answered right; the same seed draws the same two figures
    env.reset(seed=2)
    assert env.unwrapped.figure == first
    env.step(f"\\boxed{{{solve(env.unwrapped.figure)}}}")
    _, reward, terminated, _, info = env.step(env.unwrapped.oracle_action())
    assert (reward, terminated) == (1.0, True) and info["success"]


def test_followup_passes_the_env_checker():
    from gem_core.testing.env_checker import check_env

    check_env(gem_core.make("vision:Geometry-v0-followup", image_size=96), seed=3)
