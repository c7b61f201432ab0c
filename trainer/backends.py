"""Generation backends: who samples the policy's tokens during collection.

Both return the sampled token ids and their logprobs exactly as generated, plus the weights version
that produced them, so the learner can bound staleness and use the sampling logprobs as the
behaviour policy in the clipped ratio.

- `HFBackend`: a transformers model on CPU/GPU, sampled in a worker thread with seeded
  `torch.Generator`s (greedy at temperature 0), under `torch.inference_mode`, with its KV
  cache; the requests of concurrent episodes decode as one batch (`batching.LockstepBatcher`).
  It keeps its own copy of the weights, so collection can go on while the learner updates its
  model; `sync_weights` swaps the new weights in between two batches.
- `VLLMBackend`: an OpenAI-compatible `/v1/completions` server (vLLM) called with token ids in and
  `return_tokens_as_token_ids` out; `sync_weights` calls a hook after each update.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import anyio
import httpx
from pydantic import BaseModel

from .batching import BatchRequest, LockstepBatcher
from .prefix import MIN_SHARED_PREFIX, common_prefix


class Generation(BaseModel):
    token_ids: list[int]
    logprobs: list[float]
    version: int
    finish_reason: str = "stop"


class GenerationBackend(Protocol):
    version: int
    eos_id: int

    def session(self) -> AbstractAsyncContextManager[int]:
        """Open for the length of an episode; its id goes with each of the episode's requests.
        A backend that batches waits for the open sessions' requests before it runs a batch."""
        ...

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        seed: int | None = None,
        session: int | None = None,
    ) -> Generation: ...

    async def sync_weights(self, state_dict: Mapping[str, Any], version: int, model: Any = None) -> None: ...

    async def aclose(self) -> None: ...


@asynccontextmanager
async def unbatched_session() -> AsyncIterator[int]:
    """The `session` of a backend that runs each request on its own (a server that batches by
    itself, a scripted fake)."""
    yield 0


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
    """Samples from a private copy of a transformers causal LM, in a worker thread, batching the
    requests of concurrent episodes (`LockstepBatcher`: the same episodes batch the same way in
    every run, so seeded episodes are reproducible)."""

    def __init__(
        self,
        model: Any,
        *,
        eos_id: int,
        temperature: float = 1.0,
        seed: int = 0,
        device: str | None = None,
        copy_model: bool = True,
        max_batch: int = 16,
        max_wait: float = 2.0,
        precision: str = "float32",
    ) -> None:
        import torch

        self.model = copy.deepcopy(model) if copy_model else model
        if precision == "bfloat16":  # half the bytes a decoded token reads; synced weights are cast
            self.model.to(torch.bfloat16)
        elif precision != "float32":
            raise ValueError(f"precision must be float32 or bfloat16, not {precision!r}")
        self.model.eval()
        self.device = torch.device(device) if device else next(self.model.parameters()).device
        self.model.to(self.device)
        self.eos_id = eos_id
        self.pad_id = eos_id  # any id: a padded position is masked out and never sampled
        self.temperature = temperature
        self.version = 0
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(seed)
        self._lock = threading.Lock()
        self.batcher: LockstepBatcher[Generation] = LockstepBatcher(
            self._generate_chunk, max_batch=max_batch, max_wait=max_wait
        )

    def session(self) -> AbstractAsyncContextManager[int]:
        return self.batcher.session()

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        seed: int | None = None,
        session: int | None = None,
    ) -> Generation:
        return await self.batcher.submit(prompt_ids, max_new_tokens, seed, session)

    def _generate_chunk(self, requests: Sequence[BatchRequest[Generation]]) -> list[Generation]:
        """Samples every request of a chunk together: prompts left-padded (positions counted from
        each prompt's own start, padding masked out), one forward per step for all unfinished rows,
        a finished row dropped from the batch and its cache. Each row samples with its own
        generator: seeded requests with their seed, the others from the backend's in turn."""
        import torch

        with self._lock, torch.inference_mode():
            version = self.version
            rows = len(requests)
            out, mask, positions = self._prefill([r.prompt_ids for r in requests])
            gens = [self._generator(r.seed) for r in requests]
            tokens: list[list[int]] = [[] for _ in requests]
            logprobs: list[list[float]] = [[] for _ in requests]
            finish = ["length"] * rows
            live = list(range(rows))  # request index of each batch row still decoding
            past = out.past_key_values
            logits = out.logits[:, -1, :]
            next_pos = positions[:, -1] + 1
            while live:
                lp = torch.log_softmax(logits.float() / (self.temperature or 1.0), dim=-1)
                step = []
                for row, i in enumerate(live):
                    if self.temperature > 0:
                        t = int(torch.multinomial(lp[row].exp(), 1, generator=gens[i]).item())
                    else:  # greedy: the logprob is the untempered one, as the learner scores it at T=1
                        t = int(lp[row].argmax().item())
                    tokens[i].append(t)
                    logprobs[i].append(float(lp[row, t].item()))
                    if t == self.eos_id:
                        finish[i] = "stop"
                    step.append(t)
                keep = [
                    row
                    for row, i in enumerate(live)
                    if finish[i] != "stop" and len(tokens[i]) < requests[i].max_new_tokens
                ]
                if not keep:
                    break
                if len(keep) < len(live):
                    index = torch.tensor(keep)
                    past.batch_select_indices(index)
                    mask, next_pos = mask[index], next_pos[index]
                    step = [step[row] for row in keep]
                    live = [live[row] for row in keep]
                mask = torch.cat([mask, torch.ones((len(live), 1), dtype=torch.long)], dim=-1)
                out = self._forward(torch.tensor(step).view(-1, 1), mask, next_pos.view(-1, 1), past)
                past = out.past_key_values
                logits = out.logits[:, -1, :]
                next_pos = next_pos + 1
            return [
                Generation(
                    token_ids=tokens[i], logprobs=logprobs[i], version=version, finish_reason=finish[i]
                )
                for i in range(rows)
            ]

    def _prefill(self, prompts: list[list[int]]) -> tuple[Any, Any, Any]:
        """The forward over a chunk's prompts: (output with the cache, attention mask, positions).

        The prompts of a chunk usually open with the same system prompt (the policy and the tools),
        most of each prompt's tokens, and a prompt is compute-bound on a CPU, so their longest
        common prefix is run once and its cache shared by every row; each row's own rest follows,
        left-padded, so a row reads [prefix][padding][its rest] with the padding masked out and
        positions counted over its own tokens only.
        """
        import torch

        rows = len(prompts)
        shared = common_prefix(prompts) if rows > 1 else 0
        shared = min(shared, min(len(p) for p in prompts) - 1)  # every row keeps a token to run
        past = None
        if shared < MIN_SHARED_PREFIX:
            shared = 0
        else:
            head = torch.tensor([prompts[0][:shared]])
            ones = torch.ones_like(head)
            past = self._forward(
                head, ones, torch.arange(shared).view(1, -1), None, prompt=True
            ).past_key_values
            past.batch_repeat_interleave(rows)
        width = max(len(p) for p in prompts) - shared
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        rest = torch.zeros((rows, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - (len(p) - shared) :] = torch.tensor(p[shared:])
            rest[i, width - (len(p) - shared) :] = 1
        positions = (shared + rest.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([torch.ones((rows, shared), dtype=torch.long), rest], dim=-1)
        return self._forward(ids, mask, positions, past, prompt=True), mask, positions

    def _generator(self, seed: int | None) -> Any:
        import torch

        if seed is None:
            return self._gen
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        return gen

    def _forward(self, ids: Any, mask: Any, positions: Any, past: Any, *, prompt: bool = False) -> Any:
        kwargs: dict[str, Any] = {
            "input_ids": ids.to(self.device),
            "attention_mask": mask.to(self.device),
            "position_ids": positions.to(self.device),
            "past_key_values": past,
            "use_cache": True,
        }
        if not prompt:
            return self.model(**kwargs)
        try:  # the prompt's last position only: the vocabulary's logits at every prompt position
            return self.model(**kwargs, logits_to_keep=1)  # are ~200 MB
        except TypeError:  # a model without `logits_to_keep`
            return self.model(**kwargs)

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

    def session(self) -> AbstractAsyncContextManager[int]:
        """The server batches requests itself (continuous batching): nothing to wait for here."""
        return unbatched_session()

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        seed: int | None = None,
        session: int | None = None,
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
