"""Which model `synth env` reaches, and how: a keyed OpenAI-compatible endpoint, a model string
that is no model, and the probe agents' answers constrained to their JSON schema.

A new user's `--model local` is tested against the real packaged model in
test_envsynth_local_model.py; here a real HTTP server (serving recorded answers) stands in for
the endpoint, so the key and the request bodies it received can be checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envforge.synth.envsynth import (
    GATES,
    JSON_SCHEMAS,
    LiteLLMResponder,
    SynthSettings,
    load_docs,
    load_recordings,
    strip_fences,
    synthesize_env,
)

from support.envsynth_llm import build_fake_openai
from support.paths import ENVSYNTH_FIXTURES, REPO
from support.serving import ServerThread

LIBRARY_DOCS = REPO / "envs" / "library" / "docs"
ENVFORGE = [sys.executable, "-m", "envforge.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return {**env, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "COLUMNS": "200", **extra}


def test_a_keyed_endpoint_is_sent_the_key_from_the_environment(tmp_path: Path) -> None:
    # envforge's own local server, reached with --api-base, refused the fixed placeholder key
    # `synth env` used to send whatever OPENAI_API_KEY said.
    key = "sk-test-0123456789"
    app, requests = build_fake_openai(load_recordings(ENVSYNTH_FIXTURES / "library"), api_key=key)
    with ServerThread(app) as server:
        out = tmp_path / "library"
        result = subprocess.run(
            [
                *ENVFORGE,
                "synth",
                "env",
                str(LIBRARY_DOCS),
                "-o",
                str(out),
                "--model",
                "openai/fake",
                "--api-base",
                f"{server.url}/v1",
                "--max-rounds",
                "0",
            ],
            capture_output=True,
            text=True,
            env=_env(OPENAI_API_KEY=key),
            timeout=600,
        )
    assert "401" not in result.stdout + result.stderr
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert len(requests) >= 7  # every stage was answered, none refused
    report = json.loads((out / "synthesis.json").read_text())
    assert report["model"] == "openai/fake" and report["status"] == "accepted"


@pytest.mark.parametrize("model", ["nonsense", "local/no-such-model"])
def test_a_model_that_is_no_model_is_one_error_line(tmp_path: Path, model: str) -> None:
    result = subprocess.run(
        [*ENVFORGE, "synth", "env", str(LIBRARY_DOCS), "-o", str(tmp_path / "library"), "--model", model],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    text = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, text
    assert len(text.splitlines()) == 1 and text.startswith("error:"), text
    assert "Traceback" not in text and "Provider List" not in text
    assert not (tmp_path / "library").exists() and not (tmp_path / ".rejected").exists()


async def test_probe_answers_are_constrained_to_their_schema_on_request(tmp_path: Path) -> None:
    # A small model left free answers the tester with prose or half a list; llama.cpp's server
    # constrains decoding to a JSON schema given as response_format json_object + schema.
    app, requests = build_fake_openai(load_recordings(ENVSYNTH_FIXTURES / "library"))
    with ServerThread(app) as server:
        responder = LiteLLMResponder("openai/fake", api_base=f"{server.url}/v1", structured="llama.cpp")
        report = await synthesize_env(
            load_docs(LIBRARY_DOCS), tmp_path / "library", responder, SynthSettings(name="library")
        )
    assert report.status == "accepted", report.reasons
    by_stage = {}
    for body in requests:
        stage = body["messages"][0]["content"].split()[1].removeprefix("stage=")
        by_stage[stage] = body.get("response_format")
    assert by_stage["tester"] == {"type": "json_object", "schema": JSON_SCHEMAS["tester"]}
    # the checker: exactly one verdict per executed call, in order (a grammar-enforced tuple)
    proposals = json.loads(strip_fences(load_recordings(ENVSYNTH_FIXTURES / "library")["tester:0"]))
    checker = by_stage["checker"]
    assert checker is not None and checker["type"] == "json_object"
    verdicts = checker["schema"]["properties"]["verdicts"]
    assert verdicts["minItems"] == verdicts["maxItems"] == len(proposals) > 1
    assert [v["properties"]["call"] for v in verdicts["prefixItems"]] == [
        {"const": i} for i in range(len(proposals))
    ]
    for stage in ("schema", "tools", "seed", "policy", "policy_rules"):
        assert by_stage[stage] is None  # code and prose stay free


async def test_openai_style_schema_for_vllm_and_hosted_servers(tmp_path: Path) -> None:
    app, requests = build_fake_openai(load_recordings(ENVSYNTH_FIXTURES / "library"))
    with ServerThread(app) as server:
        responder = LiteLLMResponder("openai/fake", api_base=f"{server.url}/v1", structured="openai")
        await synthesize_env(
            load_docs(LIBRARY_DOCS), tmp_path / "library", responder, SynthSettings(name="library")
        )
    tester = next(b for b in requests if "stage=tester" in b["messages"][0]["content"])
    fmt = tester["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == JSON_SCHEMAS["tester"]


def test_a_rejection_is_one_line_per_gate(tmp_path: Path) -> None:
    # The account a user gets of why no env was written: every gate of the last round, in order.
    result = subprocess.run(
        [
            *ENVFORGE,
            "synth",
            "env",
            str(LIBRARY_DOCS),
            "-o",
            str(tmp_path / "library"),
            "--replay",
            str(ENVSYNTH_FIXTURES / "wrong_name_rejected"),
            "--max-rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    lines = [x.strip() for x in (result.stdout + result.stderr).splitlines()]
    account = [x for x in lines if x.split(":")[0] in GATES]
    assert [x.split(":")[0] for x in account] == list(GATES), lines
    assert account[0].startswith("static: passed (")
    assert account[1].startswith("load: passed (")
    assert account[2].startswith("probes: FAILED ") and "checks: " in account[2]
    assert all(x.endswith(": not reached") for x in account[3:])
