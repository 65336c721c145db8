"""A stand-in for RL2's SGLang server/router: ``POST /generate`` answered with SGLang's rules over
gem_core's VLLMFaithfulEngine (the golden scenario's scripted model): the output ids keep the stop
token (``output_token_logprobs`` as ``[logp, id, None]``), ``max_new_tokens``, the model's EOS and
``stop_token_ids`` stop it, the text is decoded with ``skip_special_tokens`` (SGLang's default: true),
the stop token's text kept only with ``no_stop_trim``; ``finish_reason.type`` ``stop``/``length``. An input
that leaves no room in the context (``max_model_len``) is refused as SGLang refuses it: status 400 and
``{"error": {"message": "The input (N tokens) is longer than the model's context length (M tokens)."}}``.
Other endpoints (``release_memory_occupation``, ...) answer 200 and are recorded."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gem_core.testing.golden import golden_respond
from gem_core.testing.vllm_engine import ScriptedModel, VLLMFaithfulEngine, VLLMSamplingParams


class FakeSGLang:
    def __init__(self, tokenizer, max_model_len: int = 8192):
        self.engine = VLLMFaithfulEngine(ScriptedModel(tokenizer, golden_respond), max_model_len=max_model_len)
        self.calls: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with server.lock:
                    server.calls.append((self.path, body))
                    answer = server.answer(body) if self.path.rstrip("/").endswith("/generate") else {}
                data = json.dumps(answer).encode()
                self.send_response(400 if "error" in answer else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, body: dict) -> dict:
        n, context = len(body["input_ids"]), self.engine.max_model_len
        if n >= context:  # SGLang's TokenizerManager check, answered by its HTTP server as a 400
            return {"error": {"message": f"The input ({n} tokens) is longer than the model's context length ({context} tokens)."}}
        sp = body.get("sampling_params") or {}
        params = VLLMSamplingParams(
            max_tokens=sp.get("max_new_tokens"),
            stop_token_ids=sp.get("stop_token_ids"),
            logprobs=1,
            skip_special_tokens=sp.get("skip_special_tokens", True),
            include_stop_str_in_output=bool(sp.get("no_stop_trim", False)),
        )
        out = asyncio.run(self.engine.generate(body["input_ids"], params)).outputs[0]
        triples = [[record[t].logprob, t, None] for t, record in zip(out.token_ids, out.logprobs)]
        return {
            "text": out.text,
            "meta_info": {"output_token_logprobs": triples, "finish_reason": {"type": out.finish_reason}, "completion_tokens": len(out.token_ids)},
        }

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
