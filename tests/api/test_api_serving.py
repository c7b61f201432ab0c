"""Serving from Python as `envforge serve` does: the limits a public fleet needs, refused before any
env is served when they would refuse every client, and a socket bound before anything is announced."""

from __future__ import annotations

import socket
from typing import Any

import pytest

import envforge

from support.paths import REPO

GYM = REPO / "envs" / "gym"


def test_a_setting_error_names_settings_as_each_caller_spells_them() -> None:
    exc = envforge.SettingError("{max_episodes} and {ttl} must be positive", "max_episodes", "ttl")
    assert str(exc) == "max_episodes and ttl must be positive"
    assert (
        exc.render(lambda name: "--" + name.replace("_", "-")) == "--max-episodes and --ttl must be positive"
    )
    assert isinstance(exc, ValueError)


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"max_episodes_per_client": 0}, "max_episodes_per_client"),
        ({"max_connections_per_client": 0}, "max_connections_per_client"),
        ({"body_timeout": 0.0}, "body_timeout"),
        ({"header_timeout": -1.0}, "header_timeout"),
        ({"sqlite_work_mib": 0}, "sqlite_work_mib"),
    ],
)
def test_limits_that_would_refuse_every_client_are_refused(setting: dict[str, Any], named: str) -> None:
    with pytest.raises(envforge.SettingError) as caught:
        envforge.ServeLimits(**setting)
    assert named in caught.value.names and named in str(caught.value)


def test_a_busy_port_is_the_callers_error_before_anything_is_served() -> None:
    env = envforge.load_env(GYM)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            envforge.http_server([env], port=taken.getsockname()[1])


def test_off_loopback_without_a_token_is_refused() -> None:
    with pytest.raises(ValueError, match="token"):
        envforge.http_server([envforge.load_env(GYM)], host="0.0.0.0", port=0)


def test_a_server_on_port_0_knows_its_real_port_and_serves_there() -> None:
    server = envforge.http_server([envforge.load_env(GYM)], port=0)
    assert server.port != 0 and server.url("gym") == f"http://127.0.0.1:{server.port}/envs/gym/mcp"
    from starlette.testclient import TestClient

    with TestClient(server.app, base_url=f"http://127.0.0.1:{server.port}") as client:
        listed = client.get("/control/envs")
    server.sock.close()
    assert listed.status_code == 200 and [e["name"] for e in listed.json()["envs"]] == ["gym"]
