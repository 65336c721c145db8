"""Vector envs: many envs behind one batched ``reset``/``step``.

:class:`SyncVectorEnv` runs them in this process; :class:`AsyncVectorEnv` in worker processes (CPU-bound
steps in parallel, crash and timeout recovery); :class:`RayVectorEnv` in Ray actors on a cluster (Ray is
imported only when one is built). All share :class:`VectorEnv`'s semantics: :class:`AutoresetMode`,
subset stepping with a dict of actions, and ``reset_mask``. ``gem_core.make_vec`` builds any of them
from an env id.
"""

from gem_core.vector.async_vector_env import AsyncVectorEnv
from gem_core.vector.ray_vector_env import RayVectorEnv
from gem_core.vector.sync_vector_env import SyncVectorEnv
from gem_core.vector.vector_env import AutoresetMode, VectorEnv, VectorEnvError

__all__ = ["AsyncVectorEnv", "AutoresetMode", "RayVectorEnv", "SyncVectorEnv", "VectorEnv", "VectorEnvError"]
