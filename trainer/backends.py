"""Generation backends: who samples the policy's tokens during collection.

Both return the sampled token ids and their logprobs exactly as generated, plus the weights version
that produced them, so the learner can bound staleness and use the sampling logprobs as the
behaviour policy in the clipped ratio.

- `HFBackend`: a transformers model on CPU/GPU, sampled in a worker thread with a seeded
  `torch.Generator` (greedy at temperature 0), under `torch.inference_mode`, with its KV
  cache. It keeps its own copy of the weights, so collection can go on while the learner
  updates its model; `sync_weights` swaps the new weights in between two generations.
- `VLLMBackend`: an OpenAI-compatible `/v1/completions` server (vLLM) called with token ids in and
  `return_tokens_as_token_ids` out; `sync_weights` calls a hook after each update.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import anyio
import httpx
from pydantic import BaseModel


class Generation(BaseModel):
    token_ids: list[int]
    logprobs: list[float]
    version: int
    finish_reason: str = "stop"


class GenerationBackend(Protocol):
    version: int
    eos_id: int

    async def generate(
        self, prompt_ids: list[int], *, max_new_tokens: int, seed: int | None = None
    ) -> Generation: ...

    async def sync_weights(self, state_dict: Mapping[str, Any], version: int, model: Any = None) -> None: ...

    async def aclose(self) -> None: ...


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer saved in a model dir.

    transformers 5 maps a model type to its own tokenizer class even when the dir holds a generic
    `tokenizers` file (as `tiny.build_tiny_model` writes), which would rebuild a different vocabulary;
    so a generic one is loaded as such.
    """
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg = Path(path) / "tokenizer_config.json"
    if cfg.exists() and json.loads(cfg.read_text()).get("tokenizer_class") == "TokenizersBackend":
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


class HFBackend:
    """Samples from a private copy of a transformers causal LM, one request at a time, in a thread."""

    def __init__(
        self,
        model: Any,
        *,
        eos_id: int,
        temperature: float = 1.0,
        seed: int = 0,
        device: str | None = None,
        copy_model: bool = True,
    ) -> None:
        import torch

        self.model = copy.deepcopy(model) if copy_model else model
        self.model.eval()
        self.device = torch.device(device) if device else next(self.model.parameters()).device
        self.model.to(self.device)
        self.eos_id = eos_id
        self.temperature = temperature
        self.version = 0
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(seed)
        self._lock = threading.Lock()

    async def generate(
        self, prompt_ids: list[int], *, max_new_tokens: int, seed: int | None = None
    ) -> Generation:
        return await anyio.to_thread.run_sync(self._generate, prompt_ids, max_new_tokens, seed)

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int | None) -> Generation:
        import torch

        with self._lock, torch.inference_mode():
            gen = self._gen
            if seed is not None:
                gen = torch.Generator(device=self.device)
                gen.manual_seed(seed)
            version = self.version
            ids = torch.tensor([prompt_ids], device=self.device)
            try:  # the prompt's last position only: the vocabulary's logits at every prompt position
                out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)  # are ~200 MB
            except TypeError:  # a model without `logits_to_keep`
                out = self.model(input_ids=ids, use_cache=True)
            past = out.past_key_values
            logits = out.logits[:, -1, :]
            tokens: list[int] = []
            logprobs: list[float] = []
            finish = "length"
            for _ in range(max_new_tokens):
                if self.temperature > 0:
                    lp = torch.log_softmax(logits.float() / self.temperature, dim=-1)
                    tok = torch.multinomial(lp.exp(), 1, generator=gen)
                else:  # greedy: the logprob is the untempered one, as the learner scores it at T=1
                    lp = torch.log_softmax(logits.float(), dim=-1)
                    tok = lp.argmax(dim=-1, keepdim=True)
                t = int(tok.item())
                tokens.append(t)
                logprobs.append(float(lp[0, t].item()))
                if t == self.eos_id:
                    finish = "stop"
                    break
                out = self.model(input_ids=tok.view(1, 1), past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[:, -1, :]
            return Generation(token_ids=tokens, logprobs=logprobs, version=version, finish_reason=finish)

    async def sync_weights(self, state_dict: Mapping[str, Any], version: int, model: Any = None) -> None:
        def load() -> None:
            with self._lock:
                self.model.load_state_dict(dict(state_dict))
                self.version = version

        await anyio.to_thread.run_sync(load)

    async def aclose(self) -> None:
        return None


WeightSyncHook = Callable[["VLLMBackend", Any, int], Awaitable[None]]


async def save_and_post_hook(backend: VLLMBackend, model: Any, version: int) -> None:
    """Default vLLM weight sync: save the weights under `backend.sync_dir` and POST the path.

    The server side must reload from that path (e.g. a vLLM dev endpoint or a small extension);
    `backend.sync_path` is configurable because stock vLLM has no single standard route for it.
    """
    if backend.sync_dir is None or model is None:
        return
    path = Path(backend.sync_dir) / f"v{version}"
    await anyio.to_thread.run_sync(lambda: model.save_pretrained(path))
    resp = await backend.client.post(backend.sync_path, json={"model_path": str(path), "version": version})
    resp.raise_for_status()


class VLLMBackend:
    """Token ids in, token ids + logprobs out, over an OpenAI-compatible completions endpoint."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        eos_id: int,
        temperature: float = 1.0,
        timeout: float = 120.0,
        sync_hook: WeightSyncHook | None = save_and_post_hook,
        sync_dir: str | Path | None = None,
        sync_path: str = "/update_weights",
    ) -> None:
        self.client = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout)
        self.model_name = model
        self.eos_id = eos_id
        self.temperature = temperature
        self.version = 0
        self.sync_hook = sync_hook
        self.sync_dir = sync_dir
        self.sync_path = sync_path

    async def generate(
        self, prompt_ids: list[int], *, max_new_tokens: int, seed: int | None = None
    ) -> Generation:
        version = self.version
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": prompt_ids,
            "max_tokens": max_new_tokens,
            "temperature": self.temperature,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": [self.eos_id],
            "include_stop_str_in_output": True,
        }
        if seed is not None:
            body["seed"] = seed
        resp = await self.client.post("/v1/completions", json=body)
        resp.raise_for_status()
        choice = resp.json()["choices"][0]
        lp = choice.get("logprobs") or {}
        tokens = [_token_id(t) for t in lp.get("tokens") or []]
        logprobs = [float(x) if x is not None else 0.0 for x in lp.get("token_logprobs") or []]
        if len(tokens) != len(logprobs):
            raise ValueError("server returned a different number of tokens and logprobs")
        return Generation(
            token_ids=tokens,
            logprobs=logprobs,
            version=version,
            finish_reason=choice.get("finish_reason") or "",
        )

    async def sync_weights(self, state_dict: Mapping[str, Any], version: int, model: Any = None) -> None:
        if self.sync_hook is not None:
            await self.sync_hook(self, model, version)
        self.version = version

    async def aclose(self) -> None:
        await self.client.aclose()


def _token_id(token: str) -> int:
    """vLLM's `return_tokens_as_token_ids` spells each token as 'token_id:<int>'."""
    if not token.startswith("token_id:"):
        raise ValueError(f"expected 'token_id:<n>' tokens (return_tokens_as_token_ids), got {token!r}")
    return int(token.removeprefix("token_id:"))
