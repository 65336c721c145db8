"""A small QA corpus made by gem_core: invented countries, their capitals, rivers and founding years.

The facts are invented (seeded), so a model cannot know them: it has to search. :func:`qa_corpus`
gives the documents (``{"id", "title", "text"}``, the JSONL corpus ``SearchTool`` and ``gem-core
serve-search`` read) and :func:`qa_rows` questions with their answers, one-hop and two-hop (the river of
a country's capital), with both ``question`` and ``problem`` fields so every QA id reads them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

_SYLLABLES = ["ka", "lo", "ven", "dra", "mi", "tor", "sa", "quen", "bel", "ru", "zo", "fin", "ar", "tis", "mo", "nel"]


def _name(rng: np.random.Generator, parts: int) -> str:
    return "".join(_SYLLABLES[int(i)] for i in rng.integers(len(_SYLLABLES), size=parts)).capitalize()


def _world(n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.Generator(np.random.PCG64(seed))
    used: set[str] = set()
    world = []
    while len(world) < n:
        country, capital, river = _name(rng, 3), _name(rng, 2), _name(rng, 2) + " River"
        if {country, capital, river} & used:
            continue
        used |= {country, capital, river}
        world.append({"country": country, "capital": capital, "river": river, "year": int(rng.integers(800, 1900))})
    return world


def qa_corpus(n: int = 20, seed: int = 0) -> list[dict[str, str]]:
    """Two documents per invented country: the country (capital, founding year) and its capital (river)."""
    docs = []
    for i, w in enumerate(_world(n, seed)):
        docs.append({"id": f"c{i}", "title": w["country"], "text": f"{w['country']} is a country founded in {w['year']}. Its capital city is {w['capital']}."})
        docs.append({"id": f"t{i}", "title": w["capital"], "text": f"{w['capital']} is a city on the banks of the {w['river']}."})
    return docs


def qa_rows(n: int = 20, seed: int = 0) -> list[dict[str, Any]]:
    """Questions about :func:`qa_corpus`'s countries (three per country, the last one two-hop)."""
    rows = []
    for w in _world(n, seed):
        for question, answer in (
            (f"What is the capital of {w['country']}?", w["capital"]),
            (f"In which year was {w['country']} founded?", str(w["year"])),
            (f"Which river flows through the capital of {w['country']}?", w["river"]),
        ):
            rows.append({"question": question, "problem": question, "answer": [answer]})
    return rows


def write_qa_files(folder: str | Path, n: int = 20, seed: int = 0) -> tuple[Path, Path]:
    """Write ``corpus.jsonl`` and ``questions.jsonl`` under ``folder``; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "corpus.jsonl", folder / "questions.jsonl"
    for path, rows in zip(paths, (qa_corpus(n, seed), qa_rows(n, seed))):
        with path.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")
    return paths
