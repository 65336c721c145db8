"""``llm_proxy`` for ROLL: ROLL's ``PolicyProxy`` that keeps the stop token's logprob when the pad token is the stop token.

    train_env_manager:
      llm_proxy: {proxy_type: gem_core_policy}
    val_env_manager:
      llm_proxy: {proxy_type: gem_core_policy}

Why. At ROLL 8eb27cc its router hands ``PolicyProxy`` ``eos_token_id = [eos, pad]`` (``RouterClient``), and
``postprocess_generate`` masks padding with ``get_pad_mask``, which keeps the first pad token as the stop token only
when ``eos_token == pad_token``: a list never equals the pad id. With a tokenizer whose pad token is its stop token
(SmolLM2's ``<|im_end|>``, and any model that pads with its eos) the stop token that ends a response is taken for
padding, so its ``infer_logprob`` stays 0, while the step managers train every response token
(``lm_output.batch["responses"]``). Where ``infer_logprobs`` enter the loss (ROLL's train-infer importance
correction), that token's ratio ``exp(logprob - 0)`` is its probability, not about 1.

What changes: when every id of the router's stop list is the pad id, ``postprocess_generate`` is handed that one id
(:func:`padding_stop_ids`), the case ``get_pad_mask`` is written for: the first pad token of a response is its stop
token and keeps its logprob, the rest is padding. Everything else is ROLL's ``PolicyProxy``; nothing of ROLL is
patched. A tokenizer whose pad token differs from its eos (Qwen's) is unchanged: ROLL already keeps its eos.

Importing this module imports ROLL and registers ``gem_core_policy`` in ROLL's proxy registry; ROLL's env workers
import it through :mod:`gem_integrations.roll.env_manager` (the ``env_manager_cls``) before they make a proxy.
"""

from __future__ import annotations

from typing import Any

from roll.pipeline.agentic.llm_proxy import register_llm_proxy
from roll.pipeline.agentic.llm_proxy.policy_proxy import PolicyProxy as RollPolicyProxy

from gem_integrations.roll import padding_stop_ids

PROXY_TYPE = "gem_core_policy"


class _PadAwareRouterClient:
    """ROLL's router client; each answer's ``eos_token_id`` as :func:`padding_stop_ids` gives it."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def generate_request_sync(self, *args: Any, **kwargs: Any) -> Any:
        response = self.client.generate_request_sync(*args, **kwargs)
        if response is not None and "eos_token_id" in response.meta_info:
            meta = response.meta_info
            meta["eos_token_id"] = padding_stop_ids(meta["eos_token_id"], meta.get("pad_token_id"))
        return response


@register_llm_proxy(PROXY_TYPE)
class PolicyProxy(RollPolicyProxy):
    """ROLL's ``PolicyProxy`` whose router answers keep the stop token when it is also the pad token."""

    @property
    def router_client(self) -> Any:
        return self._router_client

    @router_client.setter
    def router_client(self, client: Any) -> None:  # ROLL's __init__ sets it: every client it is given is wrapped
        self._router_client = client if isinstance(client, _PadAwareRouterClient) else _PadAwareRouterClient(client)


__all__ = ["PROXY_TYPE", "PolicyProxy"]
