"""ROLL's per-step prompt, as read from its source (alibaba/ROLL at 8eb27cc, roll/pipeline/agentic/env_manager/),
written out here for the contract tests (`nox -s roll`, no ROLL); test_roll_src.py checks it against ROLL's own
managers, prompt for prompt.

What ROLL does, and what this module encodes:

* History (``TrajEnvManager.reset`` / ``.step``): ``reset`` appends ``{"observation", "actions_left",
  "messages": None, **info}``; ``step`` pops ``info["suffix"]``, writes ``reward``, ``llm_response`` and the
  rest of the info into the current entry, then appends ``{"observation", "actions_left", "messages": None}``
  plus ``"suffix"`` when the env gave one. ``actions_left`` is ``max_steps - step``.
* ``StepConcatEnvManager.format_messages``: ``{history}`` is the ``observation`` of each entry in
  ``history[-history_length:-1]`` joined by a newline (no ``history_length`` key: no history);
  ``{current_observation}`` is ``f"{observation}\\n{suffix or ''}"`` of the current entry; ``agent_template
  .format`` gets only those two names (another field is a KeyError); a system message only when
  ``agent_system_template`` is not None. The model's own earlier responses are not shown.
* ``StepEnvManager.format_messages``: ``{env_instruction}`` (from ``history[0]``: missing is a KeyError),
  ``{history}`` of ``history[-history_length:-1]`` where ONLY entries whose ``metrics["action_is_valid"]``
  is false are listed (the ``append`` sits inside ``if not action_is_valid``), joined by ", ";
  ``{current_observation}`` is the bare ``observation`` (no suffix); ``{step_count}``, ``{history_length}``,
  ``{current_step}``, ``{max_response_length}`` when the template names them.
* Each per-step prompt is one user message (plus the optional system one) through the chat template: no
  earlier assistant turns. Only those two managers give per-step samples (``step_reinforce``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

STEP_CONCAT = "StepConcatEnvManager"
STEP = "StepEnvManager"


def manager_name(env_manager_cls: str) -> str:
    """The ROLL class a dotted ``env_manager_cls`` names (the bridge's module re-exports ROLL's own)."""
    return env_manager_cls.rsplit(".", 1)[-1]


def renderable(template: str, key: str) -> bool:
    """roll.utils.str_utils.contains_renderable_field: ``{key}``, ``{key:...}``, ``{key.x}``... in ``template``."""
    return re.search(r"\{" + re.escape(key) + r"(?!\w).*\}", template) is not None


def reset_entry(observation: str, info: dict[str, Any], max_steps: int) -> list[dict[str, Any]]:
    """The history after ``TrajEnvManager.reset``."""
    return [{"observation": observation, "actions_left": max_steps, "messages": None, **info}]


def record_step(history: list[dict[str, Any]], response: str, result: tuple, step: int, max_steps: int) -> bool:
    """``TrajEnvManager.step``'s bookkeeping after ``env.step(action=response)`` returned ``result``; returns
    whether ROLL ends the episode (terminated, or ``step >= max_steps``)."""
    observation, reward, terminated, truncated, info = result
    info = dict(info)
    suffix = info.pop("suffix", None)
    history[-1]["reward"] = reward
    history[-1]["llm_response"] = response
    history[-1].update(info)
    entry = {"observation": observation, "actions_left": max_steps - step, "messages": None}
    if suffix is not None:
        entry["suffix"] = suffix
    history.append(entry)
    return bool(terminated) or step >= max_steps


def format_messages(cfg: dict[str, Any], history: list[dict[str, Any]], step: int, max_tokens_per_step: int | None = None) -> list[dict[str, str]]:
    """The messages ROLL's per-step manager named by ``cfg["env_manager_cls"]`` builds for the current
    (last) history entry; ``step`` is ``rollout_cache.step`` (turns played)."""
    name = manager_name(cfg["env_manager_cls"])
    template = cfg["agent_template"]
    memory = history[-cfg["history_length"] : -1] if "history_length" in cfg else []
    current = history[-1]
    if name == STEP_CONCAT:
        render = {"history": "\n".join(entry["observation"] for entry in memory)}
        if renderable(template, "current_observation"):
            render["current_observation"] = f"{current['observation']}\n{current.get('suffix', '')}"
    elif name == STEP:
        lines = []
        for index, entry in enumerate(memory):
            action = entry.get("action_content", entry.get("llm_response"))
            if not entry["metrics"].get("action_is_valid", True):
                action += "(IMPORTANT TIPS: this action is not valid, your new response *must* strictly adhere to the format according to env instructions.)"
                lines.append(f"(step: {step - len(memory) + index + 1}, observation: {entry['observation']}, action: {action}, reward: {entry['reward']})")
        render = {"env_instruction": history[0]["env_instruction"], "history": ", ".join(lines)}
        optional = {
            "step_count": step,
            "history_length": len(memory),
            "current_step": step + 1,
            "current_observation": current["observation"],
            "max_response_length": max_tokens_per_step,
        }
        render.update({key: value for key, value in optional.items() if renderable(template, key)})
    else:
        raise ValueError(f"{name} does not give per-step samples (step_reinforce needs StepEnvManager or StepConcatEnvManager)")
    messages = []
    if cfg.get("agent_system_template") is not None:
        messages.append({"role": "system", "content": cfg["agent_system_template"]})
    messages.append({"role": "user", "content": template.format(**render)})
    return messages


def load_config(path: Path | str) -> dict[str, Any]:
    """A ROLL YAML as OmegaConf resolves it for the keys this example uses: a value that is exactly
    ``${a.b}`` becomes that node (its type kept); any other interpolation is refused, not guessed."""
    import yaml

    raw = yaml.safe_load(Path(path).read_text())

    def lookup(dotted: str) -> Any:
        node: Any = raw
        for part in dotted.split("."):
            node = node[part]
        return node

    def resolve(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: resolve(item) for key, item in value.items()}
        if isinstance(value, list):
            return [resolve(item) for item in value]
        if isinstance(value, str) and "${" in value:
            match = re.fullmatch(r"\$\{([\w.]+)\}", value.strip())
            if match is None:
                raise ValueError(f"{path}: interpolation inside text is not resolved here: {value!r}")
            return resolve(lookup(match.group(1)))
        return value

    return resolve(raw)
