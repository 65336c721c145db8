"""Observations that carry images: :class:`MultimodalObservation` (text with ``<image>`` placeholders, and
the images in that order).

A text env returns a string; a vision-language env returns a ``MultimodalObservation``. Everything that
reads observations (``gem_core.model_message``, the runner, the chat formatters) takes either. The
images are checked once, when the observation is made: a wrong one (not an image, undecodable bytes,
larger than :data:`MAX_IMAGE_SIDE` or :data:`MAX_IMAGE_PIXELS`, more than :data:`MAX_IMAGES`) is one
:class:`InvalidImageError` line, never a crash further down (in a processor or the engine).

The chat form is GEM's and Hugging Face processors': a message's content is a list of parts,
``{"type": "image"}`` and ``{"type": "text", "text": ...}`` (:func:`content_parts`); an OpenAI-compatible
endpoint gets each image inline as a PNG data URL (:func:`openai_content`). Pillow (the ``vision``
extra) is imported only when an image is handled.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Any

from gem_core.errors import GemError

#: Where an image goes in an observation's text (verl's and LLaVA's convention).
IMAGE_PLACEHOLDER = "<image>"
#: The most images one observation carries.
MAX_IMAGES = 8
#: The longest side, and the most pixels, of an image an observation accepts (a decompression bomb, or an
#: env drawing at the wrong scale, is refused before it reaches a processor).
MAX_IMAGE_SIDE = 4096
MAX_IMAGE_PIXELS = 4096 * 4096


class InvalidImageError(GemError, ValueError):
    """An image an observation cannot carry (wrong type, undecodable, too large, too many)."""


def require_pillow() -> None:
    """One :class:`InvalidImageError` line when Pillow (the ``vision`` extra) is not installed."""
    try:
        import PIL  # noqa: F401
    except ImportError as exc:
        raise InvalidImageError("images need Pillow: pip install -e '.[vision]'") from exc


def check_image(image: Any, index: int = 0) -> Any:
    """``image`` as an RGB ``PIL.Image.Image``; ``bytes`` are decoded (PNG, JPEG, ... as Pillow reads them).
    Anything else, or an image too large or corrupt, is one :class:`InvalidImageError` line."""
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - the vision extra is missing
        raise InvalidImageError("images need Pillow: pip install -e '.[vision]'") from exc
    where = f"image {index}"
    if isinstance(image, (bytes, bytearray, memoryview)):
        try:
            opened = Image.open(io.BytesIO(bytes(image)))  # reads the header only: the size is known before decoding
        except Image.DecompressionBombError:
            raise InvalidImageError(f"{where}: an image file too large to decode (Pillow's decompression-bomb limit)") from None
        except Exception as exc:
            raise InvalidImageError(f"{where}: {len(image)} bytes that are not an image file ({type(exc).__name__})") from None
        _check_size(opened.size, where)
        image = opened
    elif not isinstance(image, Image.Image):
        raise InvalidImageError(f"{where}: expected a PIL image or an image file's bytes, got {type(image).__name__}")
    _check_size(image.size, where)
    try:
        image.load()  # a truncated or corrupt file fails here, not inside a processor later
        return image if image.mode == "RGB" else image.convert("RGB")
    except Exception as exc:
        raise InvalidImageError(f"{where}: the image data cannot be decoded ({type(exc).__name__}: {str(exc)[:80]})") from None


def _check_size(size: tuple[int, int], where: str) -> None:
    width, height = size
    if width < 1 or height < 1 or max(width, height) > MAX_IMAGE_SIDE or width * height > MAX_IMAGE_PIXELS:
        raise InvalidImageError(f"{where}: {width}x{height} pixels; at most {MAX_IMAGE_SIDE} per side and {MAX_IMAGE_PIXELS} in all")


@dataclass(frozen=True)
class MultimodalObservation:
    """Text with one :data:`IMAGE_PLACEHOLDER` per image, and the images (RGB PIL images) in that order.

    Text without placeholders gets them in front, one line each (images before the question, as GEM's
    and most VL models' examples show them; a line break between two images, so that no template renders
    them side by side). Equal when the text and every pixel are equal.
    """

    text: str
    images: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise InvalidImageError(f"MultimodalObservation.text must be a str, got {type(self.text).__name__}")
        images = self.images
        if not isinstance(images, (list, tuple)):
            images = (images,)
        if len(images) > MAX_IMAGES:
            raise InvalidImageError(f"an observation carries at most {MAX_IMAGES} images, got {len(images)}")
        images = tuple(check_image(image, i) for i, image in enumerate(images))
        object.__setattr__(self, "images", images)
        count = self.text.count(IMAGE_PLACEHOLDER)
        if count == 0 and images:
            object.__setattr__(self, "text", (IMAGE_PLACEHOLDER + "\n") * len(images) + self.text)
        elif count != len(images):
            raise InvalidImageError(f"the text has {count} {IMAGE_PLACEHOLDER} placeholders for {len(images)} images")

    def with_text(self, text: str) -> MultimodalObservation:
        """The same images with another text (its placeholders unchanged)."""
        return MultimodalObservation(text, self.images)


def observation_text(observation: Any) -> str:
    """The text of an observation (a string is its own text)."""
    return observation.text if isinstance(observation, MultimodalObservation) else observation


def observation_images(observation: Any) -> tuple[Any, ...]:
    """The images of an observation (none for a string)."""
    return observation.images if isinstance(observation, MultimodalObservation) else ()


def _split(text: str) -> list[str]:
    return text.split(IMAGE_PLACEHOLDER)


def content_parts(observation: Any, *, escape: str | None = None) -> list[dict[str, Any]]:
    """The chat content of an observation as parts: ``{"type": "image"}`` where each placeholder was and
    ``{"type": "text", "text": ...}`` between them (empty texts left out). ``escape``: a token whose text
    must not appear in a text part (the processor's image token), replaced by a look-alike."""
    parts: list[dict[str, Any]] = []
    pieces = _split(observation_text(observation))
    for i, piece in enumerate(pieces):
        if i:
            parts.append({"type": "image"})
        if escape:
            piece = escape_token(piece, escape)
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def escape_token(text: str, token: str) -> str:
    """``text`` with every ``token`` (e.g. ``<image>`` typed by a model and echoed by an env) broken by a
    zero-width space, so a tokenizer never reads it as the special token."""
    return text.replace(token, token[:1] + "\u200b" + token[1:]) if token and token in text else text


def image_png_bytes(image: Any) -> bytes:
    """An image as PNG bytes (e.g. a dataset row's ``{"bytes": ...}`` image, as verl's parquet rows hold them)."""
    buffer = io.BytesIO()
    check_image(image).save(buffer, format="PNG")
    return buffer.getvalue()


def image_data_url(image: Any) -> str:
    """An image as a ``data:image/png;base64,...`` URL (the OpenAI chat API's inline image)."""
    return "data:image/png;base64," + base64.b64encode(image_png_bytes(image)).decode("ascii")


def openai_content(observation: Any) -> str | list[dict[str, Any]]:
    """An observation as OpenAI chat content: its text for a string; else parts, each image an
    ``image_url`` part with a PNG data URL."""
    if not isinstance(observation, MultimodalObservation):
        return observation
    images = iter(observation.images)
    out: list[dict[str, Any]] = []
    for part in content_parts(observation):
        if part["type"] == "image":
            out.append({"type": "image_url", "image_url": {"url": image_data_url(next(images))}})
        else:
            out.append(part)
    return out
