"""Shared fixtures: the bank fixture env, bundled envs, and a real HTTP fleet on an ephemeral port.

Helpers that tests import by name live in `support/` (conftest is never imported).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from envforge.server import Environment, Fleet, load_env

from support.paths import BANK_DIR, ENVS, bundled_env_dirs
from support.serving import ServerThread
from support.shop import write_shop_env


@pytest.fixture(autouse=True)
def _envforge_log_levels() -> Iterator[None]:
    """Put back every envforge logger's level after each test: a command run in-process (which
    quiets the runtime's log for the rest of its process) must not silence the log a later test
    reads through `caplog`."""
    loggers = logging.root.manager.loggerDict
    levels = {name: logging.getLogger(name).level for name in list(loggers) if name.startswith("envforge")}
    yield
    for name in list(loggers):
        if name.startswith("envforge"):
            logging.getLogger(name).setLevel(levels.get(name, logging.NOTSET))


@pytest.fixture(scope="session")
def bank_env() -> Environment:
    return load_env(BANK_DIR)


@pytest.fixture(scope="session")
def bundled_envs() -> list[Environment]:
    return [load_env(d) for d in bundled_env_dirs()]


@pytest.fixture(scope="session")
def retail_orders() -> Environment:
    return load_env(ENVS / "retail_orders")


@pytest.fixture(scope="session")
def unlucky_shop(tmp_path_factory: pytest.TempPathFactory) -> Environment:
    """The shop env (`support.shop`) without its lucky seed row: tasks there must be earned."""
    return load_env(write_shop_env(tmp_path_factory.mktemp("unlucky") / "shop", lucky=False))


@pytest.fixture(scope="module")
def http_fleet(bank_env: Environment) -> Iterator[tuple[ServerThread, Fleet]]:
    from envforge.server import build_app

    fleet = Fleet([bank_env], ttl_seconds=600)
    with ServerThread(build_app(fleet)) as server:
        yield server, fleet
