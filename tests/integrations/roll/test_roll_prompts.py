"""What the model sees under examples/roll/gem_core_rebn.yaml: each env's per-step prompt, built the way ROLL's env
manager named in the file builds it (roll_rules.py: ROLL's history bookkeeping and format_messages as read from its
source at 8eb27cc), with the envs the bridge makes, must hold the env's rules and every earlier turn at every turn.

A replay engine never notices a prompt that lost them: it returns its tokens whatever the prompt. These tests read
the prompt itself; test_roll_src.py checks the same on prompts that ROLL's own manager sends to an LLM proxy.
"""

from __future__ import annotations

from pathlib import Path

import gem
import pytest
import roll_rules

from gem_integrations.roll.rollout import ENV_TYPE

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "roll" / "gem_core_rebn.yaml"

# Moves that keep each env's episode going for three turns (checked below), one of them a tool call.
MOVES = {
    "game:GuessTheNumber-v0-easy": ["\\boxed{5}", "\\boxed{3}", "\\boxed{8}"],
    "game:Sudoku-v0-easy": ["\\boxed{1 1 4}", "\\boxed{9 9 9}", "\\boxed{2 2 1}"],
}
TOOL_MOVE = "Let me check.\n<python>print(6 * 7)</python><|im_end|>"


@pytest.fixture(scope="module")
def config():
    return roll_rules.load_config(EXAMPLE)


def play(cfg: dict, seed: int, responses: list[str]) -> tuple[list[str], list[dict]]:
    """Plays ``responses`` the way ROLL's manager does; returns the user message of each turn and the history."""
    env = gem.make(env_id=cfg["env_type"], **cfg["env_config"])  # TrajEnvManager.__init__
    try:
        observation, info = env.reset(seed=seed)
        history = roll_rules.reset_entry(observation, info, cfg["max_steps"])
        prompts = []
        for step, response in enumerate(responses):
            messages = roll_rules.format_messages(cfg, history, step, cfg["max_tokens_per_step"])
            prompts.append(messages[-1]["content"])
            if roll_rules.record_step(history, response, env.step(action=response), step + 1, cfg["max_steps"]):
                break
        return prompts, history
    finally:
        env.close()


def responses_for(cfg: dict) -> list[str]:
    moves = list(MOVES[cfg["env_config"]["env"]])
    return [TOOL_MOVE, *moves] if "python" in cfg["env_config"].get("tools", ()) else moves


def test_every_env_uses_a_per_step_manager_that_keeps_the_history(config):
    for tag, cfg in config["custom_envs"].items():
        assert cfg["env_type"] == ENV_TYPE, tag
        assert roll_rules.manager_name(cfg["env_manager_cls"]) == roll_rules.STEP_CONCAT, tag
        # ROLL slices history[-history_length:-1]: the first observation (the rules) stays up to turn history_length
        assert cfg["history_length"] >= cfg["max_steps"], tag


@pytest.mark.parametrize("seed", [0, 1])
def test_the_prompt_at_turn_k_holds_the_rules_and_every_earlier_turn(config, seed):
    for tag, cfg in config["custom_envs"].items():
        responses = responses_for(cfg)
        prompts, history = play(cfg, seed, responses)
        assert len(prompts) == len(responses) >= 3, (tag, "the moves must keep the episode going")
        rules = history[0]["observation"]
        assert "\\boxed{" in rules and "You are playing" in rules, (tag, "the first observation states the game and the answer format")
        for k, prompt in enumerate(prompts):
            assert rules in prompt, (tag, k, "the rules (the first observation) must be in every prompt")
            at = 0
            for earlier in history[1:k]:  # every earlier turn's observation, oldest first
                found = prompt.find(earlier["observation"], at)
                assert earlier["observation"].strip() and found >= 0, (tag, k, earlier["observation"])
                at = found
            current = history[k]
            assert current["observation"] in prompt, (tag, k)
            suffix = current.get("suffix", "")
            if suffix:  # the current board once; no stale board from earlier turns
                assert prompt.count(suffix) == 1, (tag, k)
                assert prompt.rstrip().endswith(suffix.rstrip()), (tag, k)


def test_guess_the_number_prompt_names_the_range_the_format_the_tool_output_and_the_earlier_guesses(config):
    cfg = config["custom_envs"]["GemGuessTheNumberPython"]
    prompts, _ = play(cfg, 0, responses_for(cfg))
    last = prompts[3]  # the fourth turn: after a tool call and two guesses
    for words in ["between 1 and 10", "\\boxed{", "<python>", "<output>\n42\n</output>", "you guessed 5", "you guessed 3"]:
        assert words in last, words


def test_sudoku_prompt_shows_the_current_grid_once(config):
    cfg = config["custom_envs"]["GemSudoku"]
    prompts, history = play(cfg, 0, responses_for(cfg))
    for k, prompt in enumerate(prompts):
        assert prompt.count("Here is the current grid:") == 1, k
        assert "Fill every empty cell" in prompt and "A move is the row, the column and the digit" in prompt, k


def test_the_rules_survive_to_the_last_turn_roll_allows(config):
    for tag, cfg in config["custom_envs"].items():
        last = cfg["max_steps"] - 1  # the prompt of the last turn ROLL plays (step max_steps - 1)
        history = [{"observation": f"observation {i}", "metrics": {"action_is_valid": True}, "env_instruction": ""} for i in range(last + 1)]
        prompt = roll_rules.format_messages(cfg, history, last)[-1]["content"]
        assert all(f"observation {i}\n" in prompt for i in range(last + 1)), tag


def test_step_env_manager_with_the_observation_alone_shows_neither(config):
    """ROLL's StepEnvManager with agent_template "{current_observation}" (the example before this fix): at turn 2 the
    prompt is the last feedback alone: no range, no answer format, no earlier guess."""
    cfg = {**config["custom_envs"]["GemGuessTheNumberPython"], "agent_template": "{current_observation}"}
    cfg["env_manager_cls"] = "gem_integrations.roll.env_manager.StepEnvManager"
    cfg["env_config"] = {key: value for key, value in cfg["env_config"].items() if key not in ("suffix", "tools")}
    prompts, history = play(cfg, 0, MOVES["game:GuessTheNumber-v0-easy"])
    assert history[0]["observation"] not in prompts[2] and "between 1 and 10" not in prompts[2] and "you guessed 5" not in prompts[2]
    with_history = {**cfg, "agent_template": "{env_instruction}{history}\n{current_observation}"}
    prompts, _ = play(with_history, 0, MOVES["game:GuessTheNumber-v0-easy"])
    assert "you guessed 5" not in prompts[2]  # its {history} lists only the turns whose action was invalid
