"""Counting envs made and closed, so a test can show that a plugin leaves no env (nor its sandbox) behind."""

from __future__ import annotations

from typing import Any

from gem_core.tasks import TaskSpec


def track_env_closes(monkeypatch: Any) -> list[dict[str, Any]]:
    """Record every env made through :meth:`TaskSpec.make_env` in this process (every plugin makes its envs
    there) while ``monkeypatch`` (pytest's fixture) is active: one dict per env, ``env_id``, ``seed`` and
    ``closed``, the number of times its ``close`` ran. A clean run ends with every ``closed`` equal to 1."""
    made: list[dict[str, Any]] = []
    make = TaskSpec.make_env

    def counted(spec: TaskSpec) -> Any:
        env = make(spec)
        close, record = env.close, {"env_id": spec.env_id, "seed": spec.seed, "closed": 0}

        def closing() -> Any:
            record["closed"] += 1
            return close()

        env.close = closing
        made.append(record)
        return env

    monkeypatch.setattr(TaskSpec, "make_env", counted)
    return made
