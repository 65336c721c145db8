"""Vector envs: many envs behind one batched ``reset``/``step``.

:class:`SyncVectorEnv` runs them in this process; :class:`AsyncVectorEnv` in worker processes (CPU-bound
steps in parallel, crash and timeout recovery); :class:`gem_core.ray.RayVectorEnv` (in the Ray backend,
a layer above) in Ray actors on a cluster. All share :class:`VectorEnv`'s semantics: :class:`AutoresetMode`,
subset stepping with a dict of actions, and ``reset_mask``. :func:`make_vec` (``gem_core.make_vec``)
builds any of them from an env id.
"""

from gem_core.vector.async_vector_env import AsyncVectorEnv
from gem_core.vector.make import MAX_NUM_ENVS, VECTOR_MODES, make_vec
from gem_core.vector.sync_vector_env import SyncVectorEnv
from gem_core.vector.vector_env import AutoresetMode, VectorEnv, VectorEnvError

__all__ = ["MAX_NUM_ENVS", "VECTOR_MODES", "AsyncVectorEnv", "AutoresetMode", "SyncVectorEnv", "VectorEnv", "VectorEnvError", "make_vec"]
