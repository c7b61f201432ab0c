"""The `envforge` command: one root app; each package contributes its own commands."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import typer  # noqa: E402

from . import server_commands  # noqa: E402

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
server_commands.register(app)


def main() -> None:
    app()
