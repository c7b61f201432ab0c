"""The env manifest (`env.toml`): the few facts about an environment that are not code or data."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .tooldef import Side

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class EnvManifest(BaseModel):
    """What `env.toml` holds. Unknown keys are rejected so typos are caught at load time."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Identifier used in URLs and task ids: lowercase, digits, underscores.")
    description: str
    version: str = "0.1.0"
    seed: str = Field("seed.json", description="Seed data file: a .json object of table -> rows, or .sql.")
    volatile_columns: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Columns left out of state comparison, e.g. timestamps: {table: [column, ...]}.",
    )
    argument_errors: Literal["envforge", "python"] = Field(
        "envforge",
        description=(
            "'envforge' validates arguments against the schema; 'python' passes them through "
            "unvalidated and words missing/unexpected arguments as Python's TypeError does, for "
            "ports whose reference implementation behaves that way (τ²-bench)."
        ),
    )
    trust: Literal["trusted", "confined"] = Field(
        "trusted",
        description=(
            "'trusted': hand-written tools.py, imported into the serving process. 'confined': "
            "model-written tools.py, never imported by the serving process; it runs in an "
            "OS-confined worker process and reaches the episode's database only through the "
            "serving process (docs/security.md)."
        ),
    )
    user_tables: list[str] = Field(
        default_factory=list,
        description=(
            "Tables that make up the simulated user's side of the state (dual control: their "
            "device), changed by the env's side='user' tools; reports hash and diff them apart."
        ),
    )
    python_owner: str | None = Field(
        None, description="Class name shown in 'python'-style argument errors, e.g. 'RetailTools'."
    )
    python_owners: dict[Side, str] = Field(
        default_factory=dict,
        description=(
            "Per tool side, the class name shown in 'python'-style argument errors where it is not "
            "python_owner's, e.g. {user = 'TelecomUserTools'} (τ²'s user toolkit)."
        ),
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must match [a-z][a-z0-9_]* (it is used in URLs and ids)")
        return v
