"""The GEM env module for RL2's ``rollout.env_path`` (RL2 loads this file by path with importlib).

    rollout.env_path=$(gem-core rl2 env-path)

It re-exports :mod:`gem_integrations.rl2.rollout`: ``generate`` (RL2 HEAD's contract) and ``reset`` /
``step`` (rl-square 0.0.2's). Absolute imports only: RL2 loads the file as a module named
``custom_module``, outside any package.
"""

from gem_integrations.rl2.rollout import generate, reset, step  # noqa: F401
