"""The Terminal env family: shell tasks (terminal-bench style) in a persistent bash inside the
bubblewrap sandbox. ``terminal:Tasks-v0`` plays the shipped tasks (:mod:`.tasks`), drawn by the reset
seed or picked with ``task=``. See docs/terminal.md. Importing this package starts nothing."""

from gem_core.envs.terminal.tasks import TASK_NAMES, TASKS, TerminalTask

__all__ = ["TASKS", "TASK_NAMES", "TerminalTask"]
