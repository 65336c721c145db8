"""Vector envs: many envs behind one batched ``reset``/``step``.

:class:`SyncVectorEnv` runs them in this process; :class:`AsyncVectorEnv` in worker processes (CPU-bound
steps in parallel, crash and timeout recovery). Both share :class:`VectorEnv`'s semantics:
:class:`AutoresetMode`, subset stepping with a dict of actions, and ``reset_mask``.
``gem_core.make_vec`` builds either one from an env id.
"""

from gem_core.vector.async_vector_env import AsyncVectorEnv
from gem_core.vector.sync_vector_env import SyncVectorEnv
from gem_core.vector.vector_env import AutoresetMode, VectorEnv, VectorEnvError

__all__ = ["AsyncVectorEnv", "AutoresetMode", "SyncVectorEnv", "VectorEnv", "VectorEnvError"]
