"""The SGLang stand-in (vllm_sglang_server.py) that honours RL2's weight sync, for the two-update test
(test_rl2_two_updates.py): after each update the engine generates with the trained weights.

RL2 0.0.2's ``Rollout.update`` posts the actor's state dict to its SGLang server one tensor per request,
``POST /update_weights_from_tensor`` with ``serialized_named_tensors`` (one base64 string per tensor-parallel
rank of the server, each a serialized ``[(name, LocalSerializedTensor(values=[one tensor per tp rank]))]``)
and ``flush_cache`` true on the last tensor. That call path is RL2's own and reaches this process over HTTP
as it would reach SGLang; only the serializer is a CPU stand-in (../rank_main.py: ``pickle`` for SGLang's
CUDA-IPC ``MultiprocessingSerializer``, a dict for ``LocalSerializedTensor``). With RL2's default tp 1 every
data-parallel rank has a server of its own, and rank_main points them all at this one engine: it stands for
``SERVERS`` servers (its third argument), each synced by its rank with the same weights (DDP).

TEST MACHINERY for the engine side, SGLang's ``update_weights_from_tensor`` done with vLLM's CPU build:

* each request's tensor is kept, the copies of one name from the servers' syncs checked equal;
* when every server's sync is in (``SERVERS`` requests with ``flush_cache``, each name received ``SERVERS``
  times), the kept state dict is written as a safetensors checkpoint (``weight-sync/update-<n>`` beside the
  port file, with the model's config) and the running engine reloads it in place, ONCE: vLLM's own
  ``Worker.reload_weights(weights_path=...)`` through ``LLM.collective_rpc``, then the tied LM head's weight
  processing redone (gem_core.testing.vllm_cpu_reload; still needed on vLLM 0.32: measured |engine -
  reloaded checkpoint| up to 2.1e-1 without it, 3.3e-5 with it), then the prefix cache reset (what SGLang's
  ``flush_cache`` is for). A checkpoint folder whose update is not kept (``GEM_TEST_KEEP_UPDATES``,
  gem_core.testing.vllm_cpu_reload.kept_updates; unset: every one, as the tests) is removed after the next
  reload (it is read for the change); the benchmark's long runs keep their evaluation points. The callable
  needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (set below, before vLLM starts).

Answered too: ``POST /gem_reloads`` (each reload: its folder, tensors, the norm of the change since the
weights the engine had before, each tensor's sum, whether the head was repacked), ``POST /gem_prompt_logprobs`` (the engine's
prompt log-probs of token sequences as it is now). Run as ``python vllm_sglang_reload_server.py MODEL_DIR
PORT_FILE SERVERS``.
"""

from __future__ import annotations

import base64
import os
import pickle
import shutil
import time

import vllm_sglang_server

SYNC_DIR = "weight-sync"  # beside the port file: one checkpoint folder per sync, update-<n>
CONFIG_FILES = ("config.json", "generation_config.json")


class WeightSync:
    """The engine side of RL2's weight sync from ``servers`` SGLang servers (see the module docstring)."""

    def __init__(self, model_dir: str, root: str, servers: int):
        self.model_dir, self.root, self.servers = model_dir, root, servers
        self.pending: dict = {}  # name -> [tensor, copies received]
        self.flushes = 0
        self.copies_differ = 0
        self.reloads: list[dict] = []
        self.synced = model_dir  # the checkpoint the engine holds: the model's, then each sync's folder

    def update_weights_from_tensor(self, llm, body: dict) -> dict:
        import torch

        encoded = body.pop("serialized_named_tensors")
        assert len(encoded) == 1, f"a server of tp size {len(encoded)}: the stand-in's engine is one worker"
        named = pickle.loads(base64.b64decode(encoded.pop()))
        for name, local in named:
            (value,) = local["values"]
            tensor = pickle.loads(value)  # rank_main's stand-in serializer: pickle
            if name in self.pending:
                self.copies_differ += not torch.equal(self.pending[name][0], tensor)
                self.pending[name][1] += 1
            else:
                self.pending[name] = [tensor, 1]
        self.flushes += bool(body.get("flush_cache"))
        if self.flushes == self.servers:
            self._reload(llm)
        return {"success": True, "message": "ok"}

    def _reload(self, llm) -> None:
        import torch
        from safetensors import safe_open
        from safetensors.torch import save_file

        from gem_core.testing.vllm_cpu_reload import kept_updates, repack_tied_lm_head

        started = time.monotonic()
        path = os.path.join(self.root, f"update-{len(self.reloads) + 1}")
        os.makedirs(path)
        copies = sorted({n for _, n in self.pending.values()})
        weights, self.pending, self.flushes = {k: v.contiguous() for k, (v, _) in self.pending.items()}, {}, 0
        save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        for name in CONFIG_FILES:
            if os.path.exists(os.path.join(self.model_dir, name)):
                shutil.copy(os.path.join(self.model_dir, name), path)
        change, missing = 0.0, []
        for name in sorted(os.listdir(self.synced)):  # read tensor by tensor: no second copy of the weights held
            if name.endswith(".safetensors"):
                with safe_open(os.path.join(self.synced, name), framework="pt") as previous:
                    for key in previous.keys():
                        if key not in weights:
                            missing.append(key)
                            continue
                        change += float((weights[key].double() - previous.get_tensor(key).double()).pow(2).sum())
        previous, self.synced = self.synced, path
        llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        tied = llm.collective_rpc(repack_tied_lm_head)
        llm.reset_prefix_cache()
        if self.reloads and not self.reloads[-1]["kept"]:
            shutil.rmtree(previous)  # read above for the change; the engine holds the new weights now (about 0.5 GB)
        self.reloads.append(
            {
                "path": path, "tensors": len(weights), "dtypes": sorted({str(v.dtype) for v in weights.values()}),
                "missing": missing, "weight_change_norm": change**0.5, "tied_lm_head_repacked": tied,
                "sums": {k: float(v.double().sum()) for k, v in weights.items()},
                "copies": copies, "copies_differ": self.copies_differ, "seconds": time.monotonic() - started,
                "float32": all(v.dtype == torch.float32 for v in weights.values()),
                "kept": len(self.reloads) + 1 in kept_updates(),
            }
        )  # fmt: skip

    def reload_records(self, llm, body: dict) -> dict:
        return {"reloads": self.reloads, "pending": len(self.pending), "flushes": self.flushes}


def prompt_logprobs(llm, body: dict) -> dict:
    """The engine's log-prob of each token after the first of each sequence in ``body["sequences"]``."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in body["sequences"]], params, use_tqdm=False)
    out = []
    for tokens, output in zip(body["sequences"], outputs):
        logprobs = output.prompt_logprobs[1:]
        out.append([logprobs[i][token].logprob for i, token in enumerate(tokens[1:])])
    return {"logprobs": out}


def main() -> None:
    import sys

    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc with a callable (repack_tied_lm_head)
    model_dir, port_file, servers = sys.argv[1], sys.argv[2], int(sys.argv.pop(3))  # main() reads the first two
    sync = WeightSync(model_dir, os.path.join(os.path.dirname(os.path.abspath(port_file)), SYNC_DIR), servers)
    handlers = {
        "update_weights_from_tensor": sync.update_weights_from_tensor,
        "gem_reloads": sync.reload_records,
        "gem_prompt_logprobs": prompt_logprobs,
    }
    vllm_sglang_server.main(handlers)


if __name__ == "__main__":
    main()
