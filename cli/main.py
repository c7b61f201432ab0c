"""The `envforge` command: one root app; each package contributes its own commands."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import typer

from . import (
    demo,
    envsynth_commands,
    harness_commands,
    import_commands,
    report_commands,
    server_commands,
    synth_commands,
    trainer_commands,
)

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
server_commands.register(app)
synth_commands.register(app)
envsynth_commands.register(app)
import_commands.register(app)
report_commands.register(app)
harness_commands.register(app)
trainer_commands.register(app)
app.command("demo")(demo.demo)


def main() -> None:
    app()
