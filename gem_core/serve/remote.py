"""An env on any OpenEnv server as a gem-core env: the ``openenv:<url>`` ids.

``gem_core.make("openenv:http://host:8000")`` opens one OpenEnv session (OpenEnv's own
``GenericEnvClient`` over its ``/ws`` WebSocket) and plays it as a gem-core :class:`~gem_core.core.Env`,
so the runner, ``gem-core eval``, every plugin's ``make-dataset`` and ReBN work on envs written for OpenEnv.

Text in, text out: the action text goes into the server's one text action field (read from its
``/schema``: the only required string field, or ``action_field``), and the observation's text field
(``observation_field``, else the only string field, else the whole observation as JSON) is the observation.
An env served by ``gem-core serve`` round-trips exactly: its observation, info (suffix included),
terminated and truncated come back as the env gave them. A server that fails mid-episode (connection lost,
an error answer to a well-formed action) is an infrastructure failure (``info["infra_error"]``), not the
policy's.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

try:  # without the openenv extra: one line naming it, not a ModuleNotFoundError from inside an import
    from openenv.core.generic_client import GenericEnvClient
    from openenv.core.utils import convert_to_ws_url
except ImportError:
    from gem_core.serve import require_openenv

    require_openenv()
    raise

from gem_core.core import Env
from gem_core.errors import INFRA_ERROR, GemError, ResetNeeded
from gem_core.params import Param
from gem_core.serve import TOKEN_ENV

#: gem-core's own served observation (gem_core.serve.environment.GemObservation) carries these fields.
_GEM_FIELDS = frozenset({"observation", "info", "terminated", "truncated"})
_IGNORED_FIELDS = frozenset({"metadata", "done", "reward"})


class OpenEnvServerError(GemError, RuntimeError):
    """The OpenEnv server at an ``openenv:`` id cannot be used (unreachable, or no text action field)."""


def http_url(url: str) -> str:
    """``url`` as the server's HTTP base (``ws://`` -> ``http://``; a bare ``host:port`` gets ``http://``)."""
    ws = convert_to_ws_url(url)
    return "https://" + ws[6:] if ws.startswith("wss://") else "http://" + ws[5:]


def auth_headers() -> dict[str, str]:
    """``Authorization: Bearer $GEM_SERVE_TOKEN`` when that variable is set (a ``gem-core serve`` off loopback
    asks for it), else nothing: the token stays out of env kwargs and dataset rows."""
    token = os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def fetch_schema(url: str, timeout: float) -> dict[str, Any]:
    """The server's ``GET /schema`` (OpenEnv's action, observation and state JSON schemas)."""
    try:
        request = urllib.request.Request(f"{http_url(url)}/schema", headers=auth_headers())
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise OpenEnvServerError(f"openenv:{url}: cannot read the server's /schema: {reason}") from None


def text_action_field(schema: dict[str, Any], url: str) -> str:
    """The action schema's one required string field (the field a text action goes into)."""
    action = schema.get("action", {})
    properties = action.get("properties", {})
    required = [name for name in action.get("required", []) if name not in _IGNORED_FIELDS]
    strings = [name for name in required if properties.get(name, {}).get("type") == "string"]
    if len(required) == 1 and len(strings) == 1:
        return strings[0]
    raise OpenEnvServerError(
        f"openenv:{url}: the action schema has no single required text field (required: {', '.join(required) or 'none'}); name the field with action_field=..."
    )


class OpenEnvEnv(Env[str, str]):
    """One OpenEnv session as a gem-core env (``openenv:<url>``). ``close()`` ends the session."""

    params = {
        "url": Param(str),
        "action_field": Param(str, none="the schema's one required text field"),
        "observation_field": Param(str, none="the only text field, else the observation as JSON"),
        "timeout": Param(float, above=0),
    }

    def __init__(self, url: str, action_field: str | None = None, observation_field: str | None = None, timeout: float = 60.0):
        self.url = url
        self.timeout = float(timeout)
        schema = fetch_schema(url, self.timeout)
        self.action_field = action_field or text_action_field(schema, url)
        self.observation_field = observation_field
        obs_fields = set(schema.get("observation", {}).get("properties", {}))
        self.gem_served = _GEM_FIELDS <= obs_fields and self.action_field == "action"
        self._client: Any = None
        self._done = True
        self._started = False

    # -- the API ---------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        kwargs: dict[str, Any] = {} if seed is None else {"seed": int(seed)}
        if options is not None:
            kwargs["options"] = options
        try:
            result = self._session().reset(**kwargs)
        except RuntimeError as err:  # the server's answer to a bad reset: the caller's mistake, one line
            raise OpenEnvServerError(f"openenv:{self.url}: reset failed: {err}") from None
        except Exception as err:
            raise OpenEnvServerError(f"openenv:{self.url}: reset failed: {type(err).__name__}: {err}") from None
        self._started, self._done = True, bool(result.done)
        obs, info, _, _ = self._convert(result)
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._started or self._done:
            raise ResetNeeded(f"openenv:{self.url}: step before reset or after the episode ended")
        try:
            result = self._session().step({self.action_field: str(action)})
        except Exception as err:  # a server that failed is infrastructure, not the policy
            self._done = True
            reason = f"openenv:{self.url}: step failed: {type(err).__name__}: {err}"
            return "", 0.0, False, True, {INFRA_ERROR: reason.splitlines()[0]}
        obs, info, terminated, truncated = self._convert(result)
        self._done = terminated or truncated
        return obs, float(result.reward or 0.0), terminated, truncated, info

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # the server may already be gone; the session is over either way
                pass

    def get_state(self) -> Any:
        raise GemError(f"openenv:{self.url}: a remote OpenEnv session cannot be snapshotted (no get_state/clone)")

    def set_state(self, state: Any) -> None:
        raise GemError(f"openenv:{self.url}: a remote OpenEnv session cannot be restored (no set_state)")

    def clone(self) -> Env:
        raise GemError(f"openenv:{self.url}: a remote OpenEnv session cannot be cloned")

    # -- helpers ---------------------------------------------------------------------------------
    def _session(self) -> Any:
        if self._client is None:
            client = GenericEnvClient(base_url=self.url, message_timeout_s=self.timeout, headers=auth_headers() or None).sync()
            client.connect()
            self._client = client
        return self._client

    def _convert(self, result: Any) -> tuple[str, dict[str, Any], bool, bool]:
        observation = dict(result.observation or {})
        done = bool(result.done)
        if self.gem_served:
            info = dict(observation.get("info") or {})
            return observation.get("observation", ""), info, bool(observation.get("terminated", done)), bool(observation.get("truncated", False))
        fields = {k: v for k, v in observation.items() if k not in _IGNORED_FIELDS}
        name = self.observation_field
        if name is None:
            texts = [k for k, v in fields.items() if isinstance(v, str)]
            name = texts[0] if len(texts) == 1 else None
        if name is not None and name in fields:
            text = str(fields.pop(name))
        else:
            text, fields = json.dumps(fields, sort_keys=True, default=str), {}
        info = {"openenv": fields, "openenv_metadata": result.metadata or observation.get("metadata") or {}}
        return text, info, done, False
