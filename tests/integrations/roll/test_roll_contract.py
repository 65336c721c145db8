"""The ROLL bridge against ROLL's interface as read from its source (alibaba/ROLL, roll/pipeline/agentic/),
with gem-llm 0.0.4's real registry: how ROLL makes, resets and steps an env, the info keys it reads,
when it ends an episode, and ReBN as ROLL's step_reinforce + batch mean_std computes it."""

from __future__ import annotations

import importlib
import importlib.util
import inspect

import gem
import numpy as np
import pytest
from gem.envs.registration import ENV_REGISTRY

import gem_core
from gem_core.errors import GemError
from gem_integrations.roll import ROLL_REBN, padding_stop_ids, rebn_settings
from gem_integrations.roll import rollout as bridge
from gem_integrations.roll import env_manager

# Keys ROLL's TrajEnvManager.reset/step write into its history entries (info is merged into them).
ROLL_HISTORY_KEYS = {"observation", "actions_left", "messages", "reward", "llm_response", "prompt_ids", "response_ids", "infer_logprobs", "state_hash"}
AGG_MODES = {"sum", "mean", "min", "max", "last", "first"}  # roll.utils.functionals.aggregate_metrics


def roll_make(**config):
    """What ROLL's TrajEnvManager.__init__ does: gem.make(env_id=env_type, **env_config)."""
    return gem.make(env_id=bridge.ENV_TYPE, **config)


def roll_episode_ends(terminated: bool, truncated: bool, step: int, max_steps: int) -> bool:
    """ROLL's end-of-episode rule (TrajEnvManager.step + run_rollout_loop): terminated, or max_steps."""
    return bool(terminated) or step >= max_steps


# ------------------------------------------------------------------------------------------------
# Registration.
# ------------------------------------------------------------------------------------------------


def test_env_manager_import_registers_once_and_survives_reimports():
    assert bridge.is_registered()
    spec = ENV_REGISTRY[bridge.ENV_TYPE]
    assert spec.entry_point == bridge.ENTRY_POINT
    importlib.reload(env_manager)  # a second import in the same worker
    bridge.register()
    path = env_manager.__file__  # the module executed again under another name
    module_spec = importlib.util.spec_from_file_location("roll_env_manager_copy", path)
    module_spec.loader.exec_module(importlib.util.module_from_spec(module_spec))
    assert [k for k in ENV_REGISTRY if k == bridge.ENV_TYPE] == [bridge.ENV_TYPE]
    assert ENV_REGISTRY[bridge.ENV_TYPE] is spec


def test_gem_register_raises_on_duplicates_so_the_bridge_checks_first():
    with pytest.raises(ValueError, match="already registered"):
        gem.register(bridge.ENV_TYPE, entry_point=bridge.ENTRY_POINT)


def test_a_foreign_entry_point_on_the_id_is_an_error_not_overwritten():
    saved = ENV_REGISTRY.pop(bridge.ENV_TYPE)
    try:
        gem.register(bridge.ENV_TYPE, entry_point="somewhere:Else")
        with pytest.raises(GemError, match="already holds"):
            bridge.register()
        assert ENV_REGISTRY[bridge.ENV_TYPE].entry_point == "somewhere:Else"
    finally:
        ENV_REGISTRY[bridge.ENV_TYPE] = saved


def test_gem_llm_own_ids_stay_gem_llm_s():
    # gem-llm 0.0.4 registers its games under the ids gem-core uses: those stay untouched.
    assert "game:GuessTheNumber-v0-easy" in ENV_REGISTRY
    assert ENV_REGISTRY["game:GuessTheNumber-v0-easy"].entry_point.startswith("gem.envs.")


def test_env_manager_names_are_roll_s_own_classes_without_roll():
    assert set(env_manager.MANAGERS) >= {"StepEnvManager", "StepConcatEnvManager", "TrajEnvManager"}
    if importlib.util.find_spec("roll") is None:
        with pytest.raises(ImportError, match="roll.pipeline.agentic.env_manager.step_env_manager"):
            env_manager.StepEnvManager  # noqa: B018
    with pytest.raises(AttributeError, match="ROLL env managers here"):
        env_manager.NoSuchManager  # noqa: B018


def test_padding_stop_ids_is_the_pad_id_alone_only_when_every_stop_id_is_pad():
    """What the documented llm_proxy hands ROLL's postprocess_generate for the router's [eos, pad]: get_pad_mask keeps a
    response's first pad token (its stop token) only when its eos argument equals the pad id."""
    assert padding_stop_ids([2, 2], 2) == 2  # SmolLM2: <|im_end|> is eos and pad
    assert padding_stop_ids([151645, 151643], 151643) == [151645, 151643]  # Qwen: ROLL already keeps the eos
    assert padding_stop_ids(2, 2) == 2 and padding_stop_ids([2, 2], None) == [2, 2] and padding_stop_ids([], 2) == []


# ------------------------------------------------------------------------------------------------
# Call shapes and info keys.
# ------------------------------------------------------------------------------------------------


def test_call_signatures_match_roll_s_calls():
    assert list(inspect.signature(gem.make).parameters)[0] == "env_id"  # ROLL: gem.make(env_id=...)
    env = roll_make(env="game:GuessTheNumber-v0-easy")
    assert isinstance(env, gem.Env) and env.env_id == bridge.ENV_TYPE
    assert "seed" in inspect.signature(env.reset).parameters
    assert "action" in inspect.signature(env.step).parameters
    observation, info = env.reset(seed=7)  # ROLL: reset(seed=group_seed + episode_id)
    result = env.step(action="\\boxed{3}")  # ROLL: step(action=responses[0])
    assert isinstance(observation, str) and len(result) == 5


def test_reset_info_has_env_instruction_and_nothing_roll_overwrites():
    observation, info = roll_make(env="game:Sudoku-v0-easy").reset(seed=0)
    assert info["env_instruction"] == ""  # StepEnvManager reads history[0]["env_instruction"]
    assert not (set(info) & ROLL_HISTORY_KEYS) and "suffix" not in info


def test_observation_is_the_model_message_with_the_suffix():
    core = gem_core.make("game:Sudoku-v0-easy")
    core_obs, core_info = core.reset(seed=3)
    env = roll_make(env="game:Sudoku-v0-easy")
    observation, _ = env.reset(seed=3)
    assert core_info["suffix"].strip() and observation == gem_core.model_message(core_obs, core_info)
    core_obs, _, _, _, core_info = core.step("\\boxed{1 1 4}")
    observation, _, _, _, info = env.step(action="\\boxed{1 1 4}")
    assert observation == gem_core.model_message(core_obs, core_info) and "suffix" not in info


def test_step_info_keys_roll_reads():
    env = roll_make(env="game:Mastermind-v0-easy")
    env.reset(seed=1)
    keys = None
    for action in ["\\boxed{1 2 3 4}", "no box at all"]:
        _, _, _, _, info = env.step(action=action)
        assert isinstance(info["use_tool"], bool) and not info["use_tool"]
        assert all(isinstance(v, float) for v in info["metrics"].values())
        assert set(info["metrics_agg_mode"]) == set(info["metrics"]) and set(info["metrics_agg_mode"].values()) <= AGG_MODES
        assert keys is None or set(info["metrics"]) == keys  # the same keys every step
        keys = set(info["metrics"])
        assert not (set(info) & ROLL_HISTORY_KEYS) and "suffix" not in info
    assert info["metrics"]["format_error"] == 1.0 and info["metrics"]["action_is_valid"] == 0.0


def test_tools_from_the_task_spec_row_and_use_tool():
    env = roll_make(env="game:GuessTheNumber-v0-easy", tools=["python"])
    observation, _ = env.reset(seed=11)
    assert "Python" in observation
    _, _, terminated, _, info = env.step(action="Let me compute.\n<python>print((1 + 10) // 2)</python><|im_end|>")
    assert info["use_tool"] is True and info["metrics"]["tool_call"] == 1.0 and not terminated
    env.close()


def test_thinking_is_stripped_like_gem_core_s_runner():
    env = roll_make(env="game:GuessTheNumber-v0-easy")
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(action="<think>maybe \\boxed{x}</think>\nI guess \\boxed{5}.<|im_end|>")
    assert not info["gem_info"]["format_error"]
    raw = roll_make(env="game:GuessTheNumber-v0-easy", strip_thinking=False)
    raw.reset(seed=0)
    _, _, _, _, info = raw.step(action="I guess \\boxed{5}. <think>and \\boxed{x}")
    assert info["gem_info"]["format_error"] or info["gem_info"]["invalid_action"]


def test_suffix_info_hands_roll_the_two_parts_of_the_model_message():
    core = gem_core.make("game:Sudoku-v0-easy")
    core_obs, core_info = core.reset(seed=3)
    env = roll_make(env="game:Sudoku-v0-easy", suffix="info")
    observation, info = env.reset(seed=3)  # TrajEnvManager.reset keeps info["suffix"] in history[0]
    assert core_info["suffix"].strip() and info["suffix"] == core_info["suffix"].strip("\n") and observation == core_obs.rstrip("\n")
    assert gem_core.model_message(observation, info) == gem_core.model_message(core_obs, core_info)
    for action in ["\\boxed{1 1 4}", "\\boxed{9 9 9}"]:
        core_obs, _, _, _, core_info = core.step(action)
        observation, _, terminated, _, info = env.step(action=action)  # TrajEnvManager.step pops info["suffix"]
        assert not terminated and "Here is the current grid" in info["suffix"] and "Here is the current grid" not in observation
        assert gem_core.model_message(observation, info) == gem_core.model_message(core_obs, core_info)
    _, info = roll_make(env="game:GuessTheNumber-v0-easy", suffix="info").reset(seed=0)
    assert info["suffix"] == ""  # no suffix: ROLL's StepConcatEnvManager renders f"{observation}\n{''}"


# ------------------------------------------------------------------------------------------------
# Infrastructure failures (gem_core.errors.INFRA_ERROR): the episode ends, flagged for the group filter.
# ------------------------------------------------------------------------------------------------


def python_tool(env):
    """The PythonTool inside a bridge env (the ToolEnvWrapper the task spec's tools added)."""
    inner = env.core
    while not hasattr(inner, "tools"):
        inner = inner.env
    return next(tool for tool in inner.tools if tool.name == "python")


def roll_aggregate(history_metrics, modes):
    """roll.utils.functionals.aggregate_metrics (as read): per key, the step values under its mode (default mean)."""
    reduce = {"sum": np.sum, "mean": np.mean, "min": np.min, "max": np.max, "last": lambda v: v[-1], "first": lambda v: v[0]}
    keys = {k for metrics in history_metrics for k in metrics}
    return {k: float(reduce[modes.get(k, "mean")]([float(m[k]) for m in history_metrics if k in m])) for k in keys}


def test_a_dead_sandbox_ends_roll_s_episode_with_reward_0_and_the_infra_metric():
    env = roll_make(env="game:GuessTheNumber-v0-easy", tools=["python"])
    env.reset(seed=0)
    _, _, _, _, first = env.step(action="\\boxed{5}")
    assert first["metrics"]["infra_error"] == 0.0 and "infra_error" not in first
    python_tool(env).sandbox.close()  # the pool shut down under the episode
    observation, reward, terminated, truncated, info = env.step(action="<python>print(1)</python><|im_end|>")
    assert (observation, reward, terminated, truncated) == ("", 0.0, True, True)  # ROLL stops on terminated
    assert info["infra_error"].startswith("python tool:") and info["gem_info"]["infra_error"] == info["infra_error"]
    assert info["metrics"]["infra_error"] == 1.0 and info["use_tool"] is False
    episode = roll_aggregate([first["metrics"], info["metrics"]], info["metrics_agg_mode"])
    assert episode["infra_error"] == 1.0  # what ROLL's formulate_rollouts puts in env/<tag>/infra_error
    env.close()


def test_a_clean_episode_reports_infra_error_0_every_step():
    env = roll_make(env="game:GuessTheNumber-v0-easy", tools=["python"])
    env.reset(seed=0)
    steps = [env.step(action=a) for a in ["<python>print(2)</python>", "\\boxed{5}"]]
    assert [s[4]["metrics"]["infra_error"] for s in steps] == [0.0, 0.0] and not any("infra_error" in s[4] for s in steps)
    env.close()


# ------------------------------------------------------------------------------------------------
# End of episode, under ROLL's rule.
# ------------------------------------------------------------------------------------------------


def test_time_limit_truncation_ends_the_episode_roll_expects():
    env = roll_make(env="game:GuessTheNumber-v0-hard", max_turns=2)
    env.reset(seed=0)
    results = [env.step(action="\\boxed{1}") for _ in range(2)]
    (_, _, t1, u1, _), (obs, _, t2, u2, info) = results
    assert not roll_episode_ends(t1, u1, 1, max_steps=50)
    assert (t2, u2) == (True, True) and roll_episode_ends(t2, u2, 2, max_steps=50)
    assert info["gem_info"]["time_limit"] is True and info["metrics"]["truncated"] == 1.0 and obs == ""


def test_the_env_s_own_turn_limit_also_ends_it():
    core = gem_core.make("game:GuessTheNumber-v0-easy")  # 4 turns
    core.reset(seed=0)
    env = roll_make(env="game:GuessTheNumber-v0-easy")
    env.reset(seed=0)
    secret = core.unwrapped.get_state()
    wrong = next(str(n) for n in range(1, 11) if f"{n}" != str(secret.get("target", secret.get("number", 0))))
    flags = []
    for step in range(1, 5):
        _, _, terminated, truncated, _ = core.step(f"\\boxed{{{wrong}}}")
        _, _, t, u, _ = env.step(action=f"\\boxed{{{wrong}}}")
        flags.append((terminated, truncated, t, u))
        if terminated or truncated:
            break
    core_terminated, core_truncated, t, u = flags[-1]
    if core_truncated and not core_terminated:  # gem-core: truncated alone, which ROLL would step past
        assert (t, u) == (True, True)
    else:
        assert t is True
    assert roll_episode_ends(t, u, len(flags), max_steps=100)


def test_a_format_error_terminates():
    env = roll_make(env="game:GuessTheNumber-v0-easy")
    env.reset(seed=0)
    _, reward, terminated, truncated, _ = env.step(action="no answer")
    assert reward < 0 and terminated and not truncated


# ------------------------------------------------------------------------------------------------
# Bad config: one clear line, at once.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"env": "game:Sudokuu-v0"}, "Did you mean"),
        ({}, "needs env"),
        ({"env": "game:Sudoku-v0-easy", "seed": 1}, "ROLL seeds every reset"),
        ({"env": "game:Sudoku-v0-easy", "max_context_tokens": 99}, "sequence_length"),
        ({"env": "game:Sudoku-v0-easy", "env_kwargs": {"nope": 1}}, "does not take 'nope'"),
        ({"env": "game:Sudoku-v0-easy", "env_kwargs": "{not json"}, "not JSON"),
        ({"env": "game:Sudoku-v0-easy", "tools": ["pyton"]}, "unknown env tool"),
        ({"env": "game:Sudoku-v0-easy", "max_turns": 0}, "max_turns"),
        ({"env": "game:Sudoku-v0-easy", "strip_thinking": "yes"}, "strip_thinking"),
        ({"env": "game:Sudoku-v0-easy", "suffix": "prompt"}, "suffix must be one of observation, info"),
    ],
)
def test_bad_config_is_one_clear_line(config, words):
    with pytest.raises(GemError) as caught:
        roll_make(**config)
    message = str(caught.value)
    assert words in message and "\n" not in message and message.startswith("ROLL env_config for gem-core")


def test_an_unknown_env_type_is_gem_s_own_error():
    with pytest.raises(ValueError, match="not found in registry"):
        gem.make(env_id="gem_core")


# ------------------------------------------------------------------------------------------------
# ReBN as ROLL computes it: step_reinforce returns, batch mean_std (torch.std: ddof 1, eps 1e-6).
# ------------------------------------------------------------------------------------------------


def roll_batch_mean_std(values: np.ndarray) -> np.ndarray:
    """roll/pipeline/agentic/utils.py agentic_reward_norm, grouping batch, mean_std, as read (numpy)."""
    std = values.std(ddof=1) if values.size > 1 else 0.0
    if values.size > 1 and abs(std) > 1e-6:
        return (values - values.mean()) / (std + 1e-6)
    return np.zeros_like(values)


def roll_step_returns(rewards: list[float], gamma: float) -> list[float]:
    """compute_discounted_returns for step_reinforce: G_t = r_t + gamma * G_{t+1} per trajectory."""
    out, running = [], 0.0
    for reward in reversed(rewards):
        running = reward + gamma * running
        out.append(running)
    return out[::-1]


def test_roll_settings_are_ddof_1_eps_1e6_min_std_1e6():
    assert ROLL_REBN == {"ddof": 1, "eps": 1e-6, "min_std": 1e-6}
    assert rebn_settings(0.9) == {"gamma": 0.9, "group_by": None, "ddof": 1, "eps": 1e-6, "min_std": 1e-6}


def test_design_md_roll_golden_values():
    from gem_core.algo import rebn

    episodes = [[0, 0, 1], [0.5, -0.1], [0]]
    returns = np.concatenate([roll_step_returns(e, 0.9) for e in episodes])
    np.testing.assert_allclose(returns, [0.81, 0.9, 1.0, 0.41, -0.1, 0.0], atol=1e-12)
    golden = [0.6468, 0.8366, 1.0475, -0.1968, -1.2724, -1.0615]
    np.testing.assert_allclose(np.asarray(rebn(episodes, **rebn_settings(0.9))), golden, atol=5e-5)
    np.testing.assert_allclose(roll_batch_mean_std(returns), golden, atol=5e-5)
    population = np.asarray(rebn(episodes, gamma=0.9, ddof=0, eps=1e-6))
    assert np.abs(population - np.asarray(golden)).max() > 1e-2  # ddof matters


@pytest.mark.parametrize("seed", range(5))
def test_core_settings_equal_roll_s_rule(seed):
    from gem_core.algo import rebn

    rng = np.random.default_rng(seed)
    episodes = [list(rng.normal(size=rng.integers(1, 5))) for _ in range(rng.integers(1, 6))]
    returns = np.concatenate([roll_step_returns(e, 0.8) for e in episodes])
    np.testing.assert_allclose(np.asarray(rebn(episodes, **rebn_settings(0.8))), roll_batch_mean_std(returns), atol=1e-9)


@pytest.mark.parametrize("episodes", [[[2.5]], [[1.0], [1.0]], [[0.0], [4e-7]], [[1.0, 0.0]], [[0.0, 1e-7]]])
def test_zeros_for_n_le_1_or_std_le_1e6(episodes):
    from gem_core.algo import rebn

    gamma = 0.0
    returns = np.concatenate([roll_step_returns(e, gamma) for e in episodes])
    expected = roll_batch_mean_std(returns)
    np.testing.assert_allclose(np.asarray(rebn(episodes, **rebn_settings(gamma))), expected, atol=1e-9)
    if returns.size <= 1 or returns.std(ddof=1) <= 1e-6:
        assert not np.any(expected)
