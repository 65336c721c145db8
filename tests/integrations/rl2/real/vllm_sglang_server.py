"""STAND-IN FOR SGLANG (its server and router; SGLang has no CPU build): the real vLLM (``vllm.LLM``, its
CPU build) holding the real model, answering RL2's ``POST /generate`` in SGLang's format, the format
the rl2 tests' stand-in (../sglang_server.py) answers and RL2 0.0.2 reads (``RL2.utils.sglang.
async_generate``: ``text``, ``meta_info.output_token_logprobs`` as ``[logp, id, None]``,
``meta_info.finish_reason.type``, ``meta_info.completion_tokens``). SGLang's sampling params mapped to
vLLM's: ``max_new_tokens`` -> ``max_tokens``, ``stop_token_ids``, ``temperature``, ``top_p``, ``top_k``,
``skip_special_tokens`` (SGLang's default true), ``no_stop_trim`` -> ``include_stop_str_in_output``,
``sampling_seed`` -> ``seed`` (none by default, as SGLang: a group's responses to one prompt differ).

``POST /gem_reference``: the core runner (``gem_core.rollout.run_episode`` + ``VLLMPolicy``) over THIS
engine for the given task specs, so RL2's rows and the reference come from one engine. Other POSTs
(RL2's ``release_memory_occupation``, ``update_weights_from_tensor``, ...) answer 200 and are recorded
(``GET /calls``), unless ``main``'s ``handlers`` answer them (vllm_sglang_reload_server.py: the weight
sync, for the two-update test). Run as ``python vllm_sglang_server.py MODEL_DIR PORT_FILE``; the port is
written once the engine is up. One request at a time (the engine is not shared between threads)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

MAX_MODEL_LEN = 1024


def sglang_answer(llm, body: dict) -> dict:
    from vllm import SamplingParams, TokensPrompt

    sp = body.get("sampling_params") or {}
    params = SamplingParams(
        max_tokens=sp.get("max_new_tokens"), temperature=float(sp.get("temperature", 1.0)), top_p=float(sp.get("top_p", 1.0)),
        top_k=int(sp.get("top_k", -1) or -1) if sp.get("top_k", -1) not in (None, 0) else -1, stop_token_ids=sp.get("stop_token_ids") or None,
        logprobs=0, skip_special_tokens=bool(sp.get("skip_special_tokens", True)), include_stop_str_in_output=bool(sp.get("no_stop_trim", False)),
        seed=sp.get("sampling_seed"),
    )  # fmt: skip
    # no seed unless given: SGLang samples each request afresh (one fixed seed would make a group's responses to a
    # prompt all the same); the engine's own seed (main) is fixed
    out = llm.generate([TokensPrompt(prompt_token_ids=list(body["input_ids"]))], params, use_tqdm=False)[0].outputs[0]
    triples = [[record[t].logprob, t, None] for t, record in zip(out.token_ids, out.logprobs)]
    reason = out.finish_reason if out.finish_reason in ("stop", "length") else "abort"
    return {"text": out.text, "meta_info": {"output_token_logprobs": triples, "finish_reason": {"type": reason}, "completion_tokens": len(out.token_ids)}}


def reference(llm, body: dict) -> dict:
    """The core runner's trajectories for ``body["rows"]`` (RL2 dataset rows) over this engine."""
    from transformers import AutoTokenizer

    from gem_core.rollout import SamplingParams, VLLMPolicy, cached_formatter, run_episode
    from gem_integrations.rl2.rollout import task_spec

    tokenizer = AutoTokenizer.from_pretrained(body["model_dir"])
    policy = VLLMPolicy(llm, seed=0)
    params = SamplingParams(**body["params"])

    async def play(row):
        spec = task_spec(row)
        env = spec.make_env()
        try:
            formatter = cached_formatter(tokenizer, system_prompt=spec.system_prompt)
            t = await run_episode(env, policy, formatter, spec.run_config(params), seed=spec.seed, env_id=spec.env_id)
        finally:
            env.close()
        s = t.as_sequence()
        return {
            "prompt_ids": s.prompt_ids, "response_ids": s.response_ids, "loss_mask": s.loss_mask, "logprobs": s.logprobs,
            "turn_ids": s.turn_ids, "token_rewards": s.token_rewards(), "rewards": s.rewards, "num_turns": t.num_turns,
        }  # fmt: skip

    async def play_all():
        return [await play(row) for row in body["rows"]]

    return {"sequences": asyncio.run(play_all())}


def _die_with_parent() -> None:
    """A killed test run leaves no engine behind: when the parent goes, this process group (the server and
    vLLM's engine process) goes too. The test starts the server as a group leader."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(1)
    os.killpg(0, signal.SIGKILL)


def main(handlers: dict | None = None) -> None:
    """Serve until killed. ``handlers``: endpoint name (the POST path's last part) -> ``handler(llm, body)``,
    its JSON answer; such a POST is recorded (``GET /calls``) without its body."""
    model_dir, port_file = sys.argv[1], sys.argv[2]
    handlers = handlers or {}
    threading.Thread(target=_die_with_parent, daemon=True).start()
    from vllm import LLM

    llm = LLM(model=model_dir, max_model_len=MAX_MODEL_LEN, dtype="float32", seed=0, enforce_eager=True)
    calls: list = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, answer):
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send({"calls": calls})

        def do_POST(self):
            path = self.path.rstrip("/")
            left = int(self.headers.get("Content-Length") or 0)
            handler = handlers.get(path.rsplit("/", 1)[-1])
            if handler is not None:
                body = json.loads(self.rfile.read(left) or b"{}")
                calls.append([path, {}])
                return self._send(handler(llm, body))
            if not path.endswith(("/generate", "/gem_reference")):  # a weight sync's body: about 150 MB, read and dropped
                while left > 0:
                    left -= len(self.rfile.read(min(left, 1 << 20)) or b"x" * left)
                calls.append([path, {}])
                return self._send({})
            body = json.loads(self.rfile.read(left) or b"{}")
            if path.endswith("/gem_reference"):
                return self._send(reference(llm, body))
            calls.append([path, body])
            self._send(sglang_answer(llm, body))

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    with open(port_file + ".tmp", "w") as handle:
        handle.write(str(httpd.server_address[1]))
    os.replace(port_file + ".tmp", port_file)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
