"""A seed is a seed: `gem-core train` on the embedded real model (SmolLM2-135M-Instruct), the same settings and
seed twice, gives the same metrics.jsonl (every field but timings and memory) and the same weights, bit for
bit; another seed gives another run; a run stopped after an update and resumed is the uninterrupted run; and the
run equals the one recorded in ``recorded_small_run.json`` where this machine computes as the recording one did:
a refactor that changes the default run's numbers fails here (issue 67). A change meant to change them records
the run again: ``GEM_RECORD_RUN=1 pytest tests/train/test_determinism.py``, and says why in its commit.

What made the same seed differ before: HF generation batched whichever episodes asked at one moment, and
the padding of a batch changes the logits' last bits, which flips a sampled token now and then. The policy
now batches in rounds (:class:`gem_core.rollout.policies.Cohort`), whatever the threads' timing."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from gem_core.precision import kernel_flags  # noqa: E402
from gem_core.train.trainer import DEFAULT_MODEL, MACHINE_FIELDS, Trainer, TrainConfig  # noqa: E402

# the default run's settings at a size a test can run twice: a warm start of one step, two RL updates of 4 episodes
SMALL = dict(model=DEFAULT_MODEL, updates=2, episodes_per_update=4, eval_episodes=4, warm_start_steps=1, warm_start_batch=4, checkpoint_every=1)


def _lines(out) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in MACHINE_FIELDS} for line in open(out / "metrics.jsonl") if line.strip()]


def _weights(out) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "model" / "model.safetensors"))


def _run(out, **overrides):
    from gem_core.train.run import train

    return train(TrainConfig(out=str(out), **{**SMALL, **overrides}), progress=False, log=lambda _: None)


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


RECORDED = Path(__file__).with_name("recorded_small_run.json")


def _machine() -> dict:
    import transformers

    # what decides a run's last bits beside the code: the libraries, the instruction sets the kernels pick from, the threads
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "arch": platform.machine(),
        "isa": kernel_flags(),
        "threads": torch.get_num_threads(),
    }


def _weights_sha256(weights: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(weights[name].contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _check_recorded(lines: list[dict], weights: dict) -> None:
    """The run against the one recorded on a machine like this one (``GEM_RECORD_RUN=1``: record this machine's);
    the file holds one recording per machine (``runs``), so the check runs wherever one matches."""
    run = {"machine": _machine(), "metrics": lines, "weights_sha256": _weights_sha256(weights)}
    stored = json.loads(RECORDED.read_text())
    runs = stored.get("runs", [stored])  # a file of one recording, before it held several
    if os.environ.get("GEM_RECORD_RUN") == "1":
        runs = [r for r in runs if r["machine"] != run["machine"]] + [run]
        RECORDED.write_text(json.dumps({"runs": runs}, indent=1, sort_keys=True) + "\n")
    recorded = next((r for r in runs if r["machine"] == run["machine"]), None)
    if recorded is None:
        machines = [r["machine"] for r in runs]
        pytest.skip(f"the recorded runs are of other machines ({machines}; here {run['machine']}): bit-for-bit holds on one")
    assert run["metrics"] == recorded["metrics"], "the default run's small configuration gives other metrics than the recorded run"
    assert run["weights_sha256"] == recorded["weights_sha256"], "the default run's small configuration gives other weights than the recorded run"


def test_the_same_seed_gives_the_same_run_bit_for_bit_and_another_seed_another(tmp_path, monkeypatch):
    """The seed runs twice: once uninterrupted, once stopped after update 1 and resumed. The second computes the warm
    start and update 1 again from the seed alone (they must repeat bit for bit) and update 2 from its checkpoint (the
    checkpoint must hold all that update 2 reads), so it is the uninterrupted run repeated; a third, uninterrupted
    copy would add a run's minutes and no check. Another seed, the same settings, stopped after update 1 too: its
    update 1 (batch, loss, gradient) must differ already."""
    update = Trainer.update

    def stop_at_the_second(self):
        if self.step == 1:
            raise KeyboardInterrupt
        return update(self)

    def run_to_update_1(out, **overrides):
        monkeypatch.setattr(Trainer, "update", stop_at_the_second)
        with pytest.raises(KeyboardInterrupt):
            _run(out, **overrides)
        monkeypatch.setattr(Trainer, "update", update)
        assert [line["step"] for line in _lines(out)] == [0, 1]

    first = tmp_path / "first"
    _run(first)
    lines = _lines(first)
    assert [line.get("phase") for line in lines] == ["warm_start", "rl", "rl"]
    assert all("loss" in line and "eval_success_rate" not in line or line["step"] == 2 for line in lines[1:])
    # the same run as recorded (after the checks below: a skip there must not hide them)
    recorded_run = (lines, _weights(first))

    other = tmp_path / "other"
    run_to_update_1(other, seed=1)
    assert _lines(other)[1] != lines[1]

    stopped = tmp_path / "stopped"
    run_to_update_1(stopped)
    # the weights after update 1 (each stopped run's checkpoint): another seed, other weights
    after_update_1 = [torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=False)["model"] for out in (other, stopped)]
    assert not _same_weights(*after_update_1)
    _run(stopped, resume=True)
    assert _lines(stopped) == lines
    assert _same_weights(_weights(stopped), _weights(first))
    _check_recorded(*recorded_run)
