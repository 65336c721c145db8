"""gem_core on a Ray cluster (``pip install 'gem-core[ray]'``; Ray is imported only when used).

* ``gem_core.make_vec(id, n, vectorization_mode="ray")``: :class:`RayVectorEnv`, envs in
  Ray actors; a :class:`RayVectorEnv` is also a pool for the rollout runner.
* :mod:`gem_core.ray.services`: the Python sandbox as pool actors on every node, and one search server.
* :mod:`gem_core.ray.cluster`: which cluster is used (the running one first) and who shuts it down.
"""

from gem_core.ray.cluster import RayBackendError, connect, release, require_ray
from gem_core.ray.vector_env import RayVectorEnv

__all__ = ["RayBackendError", "RayVectorEnv", "connect", "release", "require_ray"]
