"""Training and collection on a token-protected fleet (`--fleet-url` with `--token`).

A fleet that listens beyond loopback must demand a bearer token on its control plane. The
trainer's remote fleet carries the token it is given to every control request; a wrong token is
refused as an infra error naming the status; and the token, a secret, never reaches a file the
run writes (its options are dumped with stars) nor a printed spec.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from envforge.harness import InfraError
from envforge.trainer import RunOptions, WorkerSpec
from envforge.trainer.run import _fleet

from support.paths import REPO
from support.serving import envforge_serve

RETAIL = REPO / "envs" / "retail_orders"
TOKEN = secrets.token_urlsafe(16)


@pytest.fixture(scope="module")
def guarded_fleet() -> Iterator[str]:
    with envforge_serve([str(RETAIL)], args=["--token", TOKEN]) as url:
        yield url


def options(url: str, token: str | None, tmp_path: Path) -> RunOptions:
    return RunOptions(model=tmp_path, envs=[RETAIL], out=tmp_path / "run", fleet_url=url, fleet_token=token)


async def play_one_call(fleet: object) -> str:
    episode = await fleet.create_episode("retail_orders")  # type: ignore[attr-defined]
    try:
        result = await fleet.call(episode.id, "get_product", {"product_id": "P-104"})  # type: ignore[attr-defined]
        await fleet.export(episode.id)  # type: ignore[attr-defined]
        return result.text
    finally:
        await fleet.close_episode(episode.id)  # type: ignore[attr-defined]
        await fleet.aclose()  # type: ignore[attr-defined]


def test_the_run_reaches_a_guarded_fleet_with_its_token(guarded_fleet: str, tmp_path: Path) -> None:
    text = anyio.run(play_one_call, _fleet(options(guarded_fleet, TOKEN, tmp_path)))
    assert "P-104" in text


@pytest.mark.parametrize("token", [None, "not-the-token"], ids=["no-token", "wrong-token"])
def test_a_missing_or_wrong_token_is_refused(guarded_fleet: str, tmp_path: Path, token: str | None) -> None:
    with pytest.raises(InfraError, match="401"):
        anyio.run(play_one_call, _fleet(options(guarded_fleet, token, tmp_path)))


def test_the_token_reaches_ray_workers_but_no_file_or_printout(tmp_path: Path) -> None:
    opts = options("http://127.0.0.1:1", TOKEN, tmp_path)
    spec = WorkerSpec.from_options(opts)
    assert spec.env.fleet_token is not None and spec.env.fleet_token.get_secret_value() == TOKEN
    for shown in (opts.model_dump_json(), repr(opts), spec.model_dump_json(), repr(spec), str(spec)):
        assert TOKEN not in shown


def test_collect_with_a_wrong_token_is_one_error_line_before_any_model_loads(
    guarded_fleet: str, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    proc = subprocess.run(
        [sys.executable, "-m", "envforge.cli", "collect", "--model", str(model), "--envs", str(RETAIL),
         "--fleet-url", guarded_fleet, "--token", "not-the-token", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "ENVFORGE_TOKEN": ""},
    )  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: --fleet-url") and "token" in lines[0]
    assert "not-the-token" not in proc.stderr + proc.stdout
