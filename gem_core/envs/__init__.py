"""Built-in environments. Importing this registers their ids (cheap: nothing heavy is imported)."""

from gem_core.envs import games  # noqa: F401  (registers game:* ids)
from gem_core.envs import task_ids  # noqa: F401,E402  (registers math:*, eval:*, ... ids)
from gem_core.envs import retail  # noqa: F401,E402  (registers multiagent:Retail-v0)
