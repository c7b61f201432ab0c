"""Checks a command runs before any slow or costly work: a model folder, an API key, a server's envs.

Each would otherwise surface much later and far from its cause: a missing key as an infra failure
per trial in `trials.jsonl`, a wrong `--model` as a Hugging Face stack trace after torch loads, an
env the server lacks as a 404 inside the first episode. Each check raises `UsageError` naming the
option at fault and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import UsageError

SERVER_CHECK_TIMEOUT_S = 10.0


def check_model_dir(model: Path) -> None:
    """`--model` must be a local Hugging Face model folder: checked before torch is imported."""
    if not model.exists():
        raise UsageError(
            f"--model {model}: no such folder (give a local Hugging Face model folder with config.json, "
            "e.g. one written by save_pretrained)"
        )
    if not model.is_dir() or not (model / "config.json").is_file():
        raise UsageError(
            f"--model {model}: not a Hugging Face model folder (it has no config.json; give the folder "
            "that save_pretrained wrote)"
        )


def missing_api_keys(model: str) -> list[str]:
    """The API-key variables litellm needs for `model` that are not set (an API base it may lack is
    not counted: local servers such as Ollama have a default one)."""
    import litellm

    try:
        found: dict[str, Any] = litellm.validate_environment(model=model)
    except Exception:  # litellm cannot tell for this provider: the call itself will say
        return []
    return [k for k in found.get("missing_keys", []) if str(k).endswith("_KEY")]


def check_api_key(option: str, model: str, api_base: str | None, api_base_option: str | None) -> None:
    """A hosted model given without its key fails now, not as one infra failure per call.

    With an API base the model is served by the user's own server, which may need no key."""
    if api_base:
        return
    missing = missing_api_keys(model)
    if missing:
        base_hint = f", or give {api_base_option} for a server that needs no key" if api_base_option else ""
        raise UsageError(
            f"{option} {model} needs {' or '.join(missing)}, which is not set "
            f"(export {missing[0]}=...{base_hint})"
        )


def served_env_names(url: str, token: str | None, option: str) -> list[str]:
    """The env names an `envforge serve` at `url` serves (GET /control/envs)."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    endpoint = url.rstrip("/") + "/control/envs"
    try:
        response = httpx.get(endpoint, headers=headers, timeout=SERVER_CHECK_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise UsageError(
            f"{option} {url}: cannot reach an envforge server there ({type(exc).__name__}: {exc}); "
            "start one with `envforge serve ENV_DIR...` or fix the URL"
        ) from exc
    if response.status_code in (401, 403):
        raise UsageError(
            f"{option} {url}: the server refused the control-plane token "
            f"(HTTP {response.status_code}); pass its token with --token or ENVFORGE_TOKEN"
        )
    try:
        response.raise_for_status()
        return [str(e["name"]) for e in response.json()["envs"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"{option} {url}: not an envforge server ({endpoint} answered HTTP {response.status_code})"
        ) from exc


def check_served_envs(url: str, token: str | None, wanted: Mapping[str, Path], option: str) -> None:
    """Every env the command plays (name -> its folder) must be served at `url`, or each of its
    episodes would fail."""
    served = served_env_names(url, token, option)
    missing = [name for name in wanted if name not in served]
    if missing:
        raise UsageError(
            f"{option} {url} does not serve {', '.join(missing)} (it serves: "
            f"{', '.join(served) or 'nothing'}); restart it with those env folders: "
            f"envforge serve ... {' '.join(str(wanted[m]) for m in missing)}"
        )
