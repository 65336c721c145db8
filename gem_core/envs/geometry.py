"""Geometry with pictures: the env draws a figure (Pillow), the model reads its labels and answers in ``\\boxed{}``.

Each episode draws one figure from the seed: a right triangle with its two legs labelled (the hypotenuse?),
a rectangle with its sides labelled (area or perimeter?), a circle with its radius labelled (area or
circumference, in terms of pi?), or a triangle with two angles labelled (the third?). The reset observation
is a :class:`~gem_core.multimodal.MultimodalObservation`: the picture and the question. The answer is the
last ``\\boxed{}`` of the response, graded by gem_core's math grader (``25\\pi``, ``25 \\pi`` and
``\\pi \\cdot 25`` are all right). ``max_attempts`` > 1 allows retries: a wrong answer gets a text message
and another try; reward 1 for the right answer, 0 otherwise. ``figures`` > 1 shows more figures, one at a
time: once a figure is answered (right, or its attempts used up), the next observation holds the feedback and
the next figure with its question, an image in a later turn (``vision:Geometry-v0-followup``). Nothing is
downloaded: the figures are drawn here.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gem_core.core import Env
from gem_core.errors import ResetNeeded
from gem_core.multimodal import IMAGE_PLACEHOLDER, MultimodalObservation, require_pillow
from gem_core.params import Param
from gem_core.parsing import echo, last_boxed

INSTRUCTION = "Read the labels in the picture. Put your final answer within \\boxed{}."
KINDS = ("right_triangle", "rectangle", "circle", "angles")
#: An answer longer than this is not graded (no figure here has a longer answer; math-verify on megabytes is slow).
MAX_ANSWER_CHARS = 64
# Pythagorean triples: the hypotenuse is a whole number.
_TRIPLES = ((3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (20, 21, 29), (9, 40, 41))


class GeometryEnv(Env):
    """A figure drawn from the seed and a question on it (see the module docstring).

    ``max_attempts``: answers allowed per episode (1: single turn). ``image_size``: the picture's side in
    pixels. ``kind``: which figure to draw (one of :data:`KINDS`; ``"any"``, the default: drawn from the seed).
    ``figures``: figures per episode, each shown once the one before it is answered (reward 1 per figure
    answered right). ``figure`` holds the current figure's numbers (kind, labels, question, answer).
    """

    params: ClassVar[dict[str, Param]] = {
        "max_attempts": Param(int, low=1, high=10),
        "image_size": Param(int, low=96, high=1024),
        "kind": Param(str, choices=("any", *KINDS)),
        "figures": Param(int, low=1, high=4),
    }
    format_error_reward = 0.0

    def __init__(self, max_attempts: int = 1, image_size: int = 256, kind: str = "any", figures: int = 1):
        require_pillow()  # the figures are drawn with Pillow: without it, one line when the env is made
        self.max_attempts = int(max_attempts)
        self.image_size = int(image_size)
        self.kinds = KINDS if kind == "any" else (kind,)
        self.figures = int(figures)
        self.max_turns = self.max_attempts * self.figures
        self.figure: dict[str, Any] = {}
        self.drawn: list[dict[str, Any]] = []  # the episode's figures, drawn at reset
        self.figure_index = 0
        self.solved = 0  # figures answered right this episode
        self.attempts = 0
        self.done = True

    # -- the figure ------------------------------------------------------------------------------------
    def _draw_numbers(self) -> dict[str, Any]:
        rng = self.np_random
        kind = self.kinds[int(rng.integers(len(self.kinds)))]
        if kind == "right_triangle":
            a, b, c = _TRIPLES[int(rng.integers(len(_TRIPLES)))]
            k = int(rng.integers(1, 4)) if c <= 17 else 1
            a, b, c = a * k, b * k, c * k
            return {"kind": kind, "a": a, "b": b, "question": "How long is the hypotenuse of this right triangle?", "answer": str(c)}
        if kind == "rectangle":
            w, h = int(rng.integers(2, 20)), int(rng.integers(2, 20))
            if rng.integers(2):
                return {"kind": kind, "w": w, "h": h, "question": "What is the area of this rectangle?", "answer": str(w * h)}
            return {"kind": kind, "w": w, "h": h, "question": "What is the perimeter of this rectangle?", "answer": str(2 * (w + h))}
        if kind == "circle":
            r = int(rng.integers(1, 15))
            if rng.integers(2):
                return {"kind": kind, "r": r, "question": "What is the area of this circle? Answer in terms of pi.", "answer": f"{r * r}\\pi"}
            return {"kind": kind, "r": r, "question": "What is the circumference of this circle? Answer in terms of pi.", "answer": f"{2 * r}\\pi"}
        a = int(rng.integers(20, 100))
        b = int(rng.integers(20, 160 - a))
        return {"kind": kind, "A": a, "B": b, "question": "What is the third angle of this triangle, in degrees?", "answer": str(180 - a - b)}

    def draw(self) -> Any:
        """The picture of :attr:`figure` (a new RGB image each call; the same pixels for the same figure)."""
        from PIL import Image, ImageDraw

        size = self.image_size
        image = Image.new("RGB", (size, size), "white")
        pen = ImageDraw.Draw(image)
        font = _font(max(12, size // 16))
        f, s = self.figure, size / 256
        black, width = (0, 0, 0), max(1, round(2 * s))

        def label(xy: tuple[float, float], text: str) -> None:
            pen.text((xy[0] * s, xy[1] * s), text, fill=(200, 0, 0), font=font, anchor="mm")

        if f["kind"] == "right_triangle":
            pts = [(50, 200), (50, 60), (210, 200)]
            pen.polygon([(x * s, y * s) for x, y in pts], outline=black, width=width)
            pen.rectangle((50 * s, 186 * s, 64 * s, 200 * s), outline=black, width=max(1, width // 2))
            label((30, 130), str(f["a"]))
            label((130, 222), str(f["b"]))
        elif f["kind"] == "rectangle":
            pen.rectangle((50 * s, 70 * s, 206 * s, 186 * s), outline=black, width=width)
            label((128, 52), str(f["w"]))
            label((228, 128), str(f["h"]))
        elif f["kind"] == "circle":
            pen.ellipse((48 * s, 48 * s, 208 * s, 208 * s), outline=black, width=width)
            pen.line((128 * s, 128 * s, 208 * s, 128 * s), fill=black, width=width)
            pen.ellipse((125 * s, 125 * s, 131 * s, 131 * s), fill=black)
            label((168, 112), f"r = {f['r']}")
        else:
            pen.polygon([(40 * s, 200 * s), (216 * s, 200 * s), (100 * s, 60 * s)], outline=black, width=width)
            label((72, 186), f"{f['A']}°")
            label((190, 186), f"{f['B']}°")
            label((100, 92), "?")
        return image

    # -- the API ---------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[MultimodalObservation, dict[str, Any]]:
        super().reset(seed=seed)
        # every figure of the episode drawn now: a step never draws from the RNG (sample_random_action may)
        self.drawn = [self._draw_numbers() for _ in range(self.figures)]
        self.figure = self.drawn[0]
        self.figure_index = 0
        self.solved = 0
        self.attempts = 0
        self.done = False
        text = f"{IMAGE_PLACEHOLDER}\n{self.figure['question']} {INSTRUCTION}"
        if self.figures > 1:
            text = f"Figure 1 of {self.figures}.\n{text}"
        if self.max_attempts > 1:
            text += f" You have {self.max_attempts} attempts."
        return MultimodalObservation(text, (self.draw(),)), {"kind": self.figure["kind"]}

    def _next_figure(self, feedback: str) -> MultimodalObservation:
        """The next figure (drawn at reset), shown after ``feedback`` on the last one."""
        self.figure_index += 1
        self.figure = self.drawn[self.figure_index]
        self.attempts = 0
        text = f"{feedback}\nFigure {self.figure_index + 1} of {self.figures}.\n{IMAGE_PLACEHOLDER}\n{self.figure['question']} {INSTRUCTION}"
        return MultimodalObservation(text, (self.draw(),))

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self.done:
            raise ResetNeeded("vision:Geometry: step() before reset() or after the episode ended; call reset()")
        self.attempts += 1
        left = self.max_attempts - self.attempts
        answer = last_boxed(action) if isinstance(action, str) else None
        info: dict[str, Any] = {"kind": self.figure["kind"], "format_error": answer is None, "invalid_action": False, "attempts": self.attempts}
        correct = False
        if answer is None:
            message = "Your answer was not graded: put the final answer inside \\boxed{}."
        elif len(answer) > MAX_ANSWER_CHARS:
            info["invalid_action"] = True
            message = f"Your answer {echo(answer)} is too long to be an answer."
        else:
            from gem_core.grading.math import grade_answer

            result = grade_answer(answer, self.figure["answer"])
            correct = bool(result.correct)
            message = f"Your answer {echo(answer)} is {'correct' if correct else 'not correct'}."
        self.solved += int(correct)
        info["correct"] = correct
        info["success"] = correct and self.solved == self.figure_index + 1  # every figure so far answered right
        info["figure"] = self.figure_index
        answered = correct or left <= 0
        terminated = answered and self.figure_index + 1 >= self.figures
        self.done = terminated
        reward = 1.0 if correct else 0.0
        if not answered:
            message += f" Look at the picture again and try once more ({left} attempt{'s' if left > 1 else ''} left)."
            return message, reward, False, False, info
        if not correct:
            message += f" The answer was {self.figure['answer']}."
        if not terminated:
            return self._next_figure(message), reward, False, False, info
        return message, reward, True, False, info

    def sample_random_action(self) -> str:
        return "\\boxed{" + str(int(self.np_random.integers(1, 400))) + "}"

    def oracle_action(self) -> str:
        """The right answer, boxed (``gem-core eval --policy oracle``)."""
        return "\\boxed{" + self.figure["answer"] + "}"


def _font(size: int) -> Any:
    """Pillow's embedded font at ``size`` pixels (no font file is read from the system); the older
    bitmap default where Pillow has no FreeType."""
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):  # Pillow < 10.1, or built without FreeType
        return ImageFont.load_default()
