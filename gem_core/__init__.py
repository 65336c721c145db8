"""gem_core: GEM-style multi-turn text environments, vector execution and the ReBN estimator.

``import gem_core`` needs only numpy; envs, tools and trainers are imported when used.
"""

from gem_core.core import Env, Wrapper, model_message
from gem_core.multimodal import MultimodalObservation
from gem_core.errors import GemError, RegistrationError, ResetNeeded, UnknownEnvError, UnknownKwargError
from gem_core.registry import EnvSpec, list_envs, make, register, register_alias, spec
from gem_core.vector.make import make_vec

from gem_core import envs as _envs  # noqa: F401,E402  (registers the built-in ids)

__version__ = "0.1.0"

__all__ = [
    "Env",
    "EnvSpec",
    "GemError",
    "MultimodalObservation",
    "RegistrationError",
    "ResetNeeded",
    "UnknownEnvError",
    "UnknownKwargError",
    "Wrapper",
    "list_envs",
    "make",
    "make_vec",
    "model_message",
    "register",
    "register_alias",
    "spec",
]
