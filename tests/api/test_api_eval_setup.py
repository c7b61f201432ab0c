"""What `envforge eval` settles before its first trial, called from Python as a script would: the
agent's name, each model role's `LLMConfig`, and the run's progress hooks. A script that builds its
own `EvalConfig` gets the CLI's checks and errors, before any trial, not an infra failure per trial."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from pathlib import Path

import pytest

import envforge

from support.paths import REPO

RETAIL = REPO / "envs" / "retail_orders"


def test_a_misspelt_agent_is_refused_with_the_builtin_it_resembles() -> None:
    with pytest.raises(ValueError, match=r"unknown agent 'oracl' \(did you mean 'oracle'\?\)"):
        envforge.check_agent_name("oracl")
    for fine in ("oracle", "noop", "openai/gpt-4o", "gpt-4o"):
        envforge.check_agent_name(fine)


def test_each_model_role_gets_its_own_base_and_temperature_and_builtins_get_none() -> None:
    config = envforge.EvalConfig(agent="oracle", user="openai/gpt-4o-mini", judge="openai/gpt-4o")
    assert envforge.model_roles(config) == {"user": "openai/gpt-4o-mini", "judge": "openai/gpt-4o"}
    filled = envforge.with_models(
        config,
        api_bases={"user": "http://127.0.0.1:9/v1", "agent": "http://ignored"},
        temperatures={"user": 0.3, "agent": 0.9},
    )
    assert filled.agent_llm is None  # the oracle calls no model
    assert filled.user_llm is not None and filled.judge_llm is not None
    assert (filled.user_llm.model, filled.user_llm.api_base, filled.user_llm.temperature) == (
        "openai/gpt-4o-mini",
        "http://127.0.0.1:9/v1",
        0.3,
    )
    assert (filled.judge_llm.api_base, filled.judge_llm.temperature) == (None, None)
    assert config.user_llm is None  # the given config is left as it was


def test_a_local_role_is_reached_through_its_server_not_its_spec() -> None:
    served = envforge.LLMConfig(model="openai/smollm2", api_base="http://127.0.0.1:8/v1")
    filled = envforge.with_models(envforge.EvalConfig(agent="local"), local={"agent": served})
    assert filled.agent_llm == served


def test_a_forced_http_transport_that_cannot_apply_fails_before_the_run() -> None:
    """Without the check, every trial of the run would end as an infra failure instead."""
    config = envforge.EvalConfig(agent="anthropic/claude-3-5-haiku-latest")
    with pytest.raises(ValueError, match="transport 'http' needs openai/ or hosted_vllm/"):
        envforge.with_models(config, api_bases={"agent": "http://127.0.0.1:9"}, transport="http")


def test_the_progress_hooks_see_the_run_start_and_each_trial_land(tmp_path: Path) -> None:
    started: list[tuple[int, int]] = []
    landed: list[str] = []
    frozen_before = gc.get_freeze_count()
    run = envforge.evaluate(
        [RETAIL],
        envforge.EvalConfig(agent="oracle", limit=2),
        out=tmp_path / "run",
        on_start=lambda total, done: started.append((total, done)),
        on_record=lambda record: landed.append(record.trial_key),
        on_notice=lambda message: pytest.fail(f"a clean run has nothing to warn about: {message}"),
    )
    assert started == [(2, 0)]
    assert sorted(landed) == sorted(r.trial_key for r in run.records)
    assert run.infra_failures == []
    assert gc.get_freeze_count() == frozen_before  # what the summary froze is thawed again
    with envforge.frozen_heap():
        assert gc.get_freeze_count() > frozen_before
    assert gc.get_freeze_count() == frozen_before


def test_local_model_servers_start_nothing_without_a_local_role_and_refuse_an_unknown_model() -> None:
    """Roles played by hosted models or built-ins need no server; a misspelt packaged model is
    refused before anything starts (the CLI shows it as one error line)."""
    from envforge.harness import LocalModelError

    started: list[tuple[list[str], str]] = []

    def watch(roles: Sequence[str], spec: str) -> envforge.LocalServerWatch:
        started.append((list(roles), spec))
        raise AssertionError("no server should start")

    with envforge.local_model_servers(
        {"agent": "oracle", "user": "openai/gpt-4o", "judge": None}, watch=watch
    ) as got:
        assert got == {}
    with (
        pytest.raises(LocalModelError, match="no-such-model"),
        envforge.local_model_servers({"user": "local", "agent": "local/no-such-model"}, watch=watch),
    ):
        pass
    assert started == []
