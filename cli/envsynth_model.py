"""The model behind `synth env`, `synth envs` and `synth tasks --llm`: a litellm model, any
OpenAI-compatible endpoint, or a packaged local model (`local`, `local/NAME`).

A local model is served as `eval` serves it (`local_roles`): one server for the whole command,
stopped when it ends, on an error or on Ctrl-C. Its answers are longer here than an agent's turn
(a whole tools.py), so synthesis asks for more tokens than the server's agent default, and the
probe agents' JSON answers are constrained to their schema, which llama-cpp-python's server
enforces with a grammar (`--json-schema`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .common import fail
from .local_roles import is_local, local_roles

if TYPE_CHECKING:
    from envforge.synth.envsynth import LiteLLMResponder, Structured

SYNTH_MAX_TOKENS = 2048
"""Most tokens per synthesis answer from a local model: a tools.py for a dozen tools fits, and the
prompt plus the answer stay within the packaged models' 8,192-token context."""

JSON_SCHEMA_MODES = ("auto", "llama.cpp", "openai", "off")


def _structured(mode: str, local: bool) -> Structured | None:
    if mode not in JSON_SCHEMA_MODES:
        fail(f"--json-schema {mode!r}: use one of {', '.join(JSON_SCHEMA_MODES)}")
    if mode == "auto":
        return "llama.cpp" if local else None
    if mode == "off":
        return None
    return "llama.cpp" if mode == "llama.cpp" else "openai"


def check_model(option: str, model: str) -> None:
    """A model string litellm cannot route, and that is not `local[/NAME]`, fails now in one line
    (else every call of the run would fail with litellm's paragraph about providers)."""
    import litellm

    from envforge.harness import routable_model

    litellm.suppress_debug_info = True  # else litellm prints its provider list on a miss
    if not is_local(model) and not routable_model(model):
        fail(
            f"{option} {model!r} is not a model: give provider/model (e.g. openai/gpt-4o, or "
            "openai/NAME for your own server) or local / local/NAME for a packaged model"
        )


@contextmanager
def synth_model(model: str, api_base: str | None, json_schema: str = "auto") -> Iterator[LiteLLMResponder]:
    """A responder for `model`, with a local server running for the block when `model` is local."""
    from envforge.synth.envsynth import LiteLLMResponder

    check_model("--model", model)
    local = is_local(model)
    structured = _structured(json_schema, local)
    if not local:
        yield LiteLLMResponder(model, api_base, structured=structured)
        return
    if api_base:
        fail("--api-base is for your own server; --model local starts the packaged one")
    with local_roles({"synth": model}) as configs:
        cfg = configs["synth"]
        name = cfg.model.split("/", 1)[1]
        yield LiteLLMResponder(
            cfg.model,
            cfg.api_base,
            api_key=cfg.api_key,
            label=f"local/{name}",
            structured=structured,
            timeout=cfg.timeout_s,
            max_tokens=SYNTH_MAX_TOKENS,
        )


@contextmanager
def rewrite_model(model: str | None) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """(litellm model, completion kwargs) for `synth tasks --llm MODEL`, with a local server
    running for the block when `model` is local; (None, {}) without a model."""
    if model is None or not is_local(model):
        if model is not None:
            check_model("--llm", model)
        yield model, {}
        return
    with local_roles({"rewrite": model}) as configs:
        cfg = configs["rewrite"]
        kwargs = {"api_base": cfg.api_base, "api_key": cfg.api_key, "timeout": cfg.timeout_s}
        yield cfg.model, kwargs
