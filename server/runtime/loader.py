"""Load an env folder into an `Environment`, validating everything and locating every problem.

An env folder is data: `env.toml`, `policy.md`, `schema.sql`, `tools.py` and a seed file. Loading
applies the DDL statement by statement and inserts the seed rows under the schema's constraints
(`core.seed`, in a bounded child for a confined env), and derives every tool's schema
(`core.tooldef`, in the sandbox's worker for a confined env), so a broken env fails here, with
file and line, rather than in the middle of an episode.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from ..core.envfiles import env_file, env_file_exists, read_env_text
from ..core.errors import EnvLoadError, LoadProblem
from ..core.manifest import EnvManifest
from ..core.seed import MANIFEST, SCHEMA, build_seed, open_database, state_database
from ..core.state import State, TableInfo, export_state, state_hash
from ..core.tooldef import CALL_SIDES, CallSide, ToolSpec, load_tool_module, on_side, tools_of_module
from ..sandbox.schema_policy import check_confined_schema

POLICY = "policy.md"
TOOLS = "tools.py"


@dataclass
class Environment:
    """A loaded, validated environment: tools, schema, and the serialised seed database.

    `tools` are the agent's tools, what is listed and served as the env's tools; `all_tools` adds
    those of the other sides (`Side`: the simulated user's, a task's setup actions, env
    assertions), reached through `tools_of` and `tool_on`."""

    root: Path
    manifest: EnvManifest
    policy: str
    schema_sql: str
    tools: dict[str, ToolSpec]
    tables: list[TableInfo]
    seed_db: bytes = field(repr=False)
    _seed_state: State | None = field(default=None, repr=False)
    all_tools: dict[str, ToolSpec] = field(default_factory=dict, repr=False)
    _sides: dict[str, dict[str, ToolSpec]] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.manifest.name

    def tools_of(self, side: CallSide) -> dict[str, ToolSpec]:
        """The tools a call on `side` may reach, in tools.py's order ("agent": `tools`)."""
        if side == "agent":
            return self.tools
        found = self._sides.get(side)
        if found is None:
            if side not in CALL_SIDES:
                raise ValueError(f"side {side!r} is not one of {', '.join(CALL_SIDES)}")
            every = self.all_tools or self.tools
            found = self._sides[side] = {n: s for n, s in every.items() if on_side(s.side, side)}
        return found

    def tool_on(self, name: str, side: CallSide) -> ToolSpec | None:
        """The tool `name` if a call on `side` may reach it; None otherwise (as if it did not exist)."""
        if side == "agent":
            return self.tools.get(name)
        return self.tools_of(side).get(name)

    def seed_state(self) -> State:
        """The canonical export of the seed database (computed once)."""
        if self._seed_state is None:
            conn = open_database(self.seed_db)
            try:
                self._seed_state = export_state(conn, self.tables, self.manifest.volatile_columns)
            finally:
                conn.close()
        return self._seed_state

    def seed_hash(self) -> str:
        return state_hash(self.seed_state())

    def database_from_state(self, state: State) -> bytes:
        """Build a serialised database holding exactly `state` (e.g. a task's initial state).

        Raises `ValueError` naming the table and row when the state breaks the schema.
        """
        return state_database(self.schema_sql, self.root / SCHEMA, state, self.tables)


def _load_manifest(root: Path) -> EnvManifest:
    path = root / MANIFEST
    if not env_file_exists(root, MANIFEST):
        raise EnvLoadError([LoadProblem(path, None, "manifest is missing")])
    try:
        data = tomllib.loads(read_env_text(root, MANIFEST))
    except tomllib.TOMLDecodeError as exc:
        line = getattr(exc, "lineno", None)
        raise EnvLoadError([LoadProblem(path, line, f"invalid TOML: {exc}")]) from exc
    try:
        return EnvManifest.model_validate(data)
    except ValidationError as exc:
        problems = [
            LoadProblem(path, None, f"{'.'.join(str(p) for p in e['loc']) or 'manifest'}: {e['msg']}")
            for e in exc.errors()
        ]
        raise EnvLoadError(problems) from exc


def _load_tools(
    root: Path, manifest: EnvManifest, tables: set[str], *, static_gate: bool = True
) -> dict[str, ToolSpec]:
    path = root / TOOLS
    if not env_file_exists(root, TOOLS):
        raise EnvLoadError([LoadProblem(path, None, "tools.py is missing")])
    path = env_file(root, TOOLS)  # its real path, inside the folder: what the tools are read from
    if manifest.trust == "confined":
        from ..sandbox.confined_tools import load_confined_tools  # model-written code: never imported here

        if static_gate:
            _gate(path)
        tools = load_confined_tools(path, manifest)
    else:
        tools = tools_of_module(load_tool_module(path, manifest.name), path)
    _check_writes(tools, tables, path)
    return tools


def _gate(path: Path) -> None:
    """Model-written tools pass the static gate before any worker runs them, at load as at
    synthesis: a tools.py written or changed after synthesis (or never synthesized here) gets
    no way around the first filter. The sandbox stays the boundary either way."""
    from ..sandbox.static_gate import check_python

    violations = check_python(path.read_text(encoding="utf-8"))
    if violations:
        raise EnvLoadError(
            [
                LoadProblem(path, v.line, f"the static gate refuses it: {v.rule}: {v.detail}")
                for v in violations
            ]
        )


def _check_writes(tools: dict[str, ToolSpec], tables: set[str], path: Path) -> None:
    """A `writes=` naming a table the schema lacks is a load error (the SQL guard enforces the rest)."""
    problems = [
        LoadProblem(
            path,
            spec.source_line,
            f"tool {spec.name!r}: writes= names {', '.join(map(repr, unknown))}, "
            f"which schema.sql does not define",
        )
        for spec in tools.values()
        if (unknown := [t for t in spec.writes if t not in tables])
    ]
    if problems:
        raise EnvLoadError(problems)


def load_env(root: str | Path, *, static_gate: bool = True) -> Environment:
    """Load and validate an env folder. Raises `EnvLoadError` listing problems with file and line.

    A confined env's tools.py must pass the static gate (`static_gate.check_python`) first, and
    its schema.sql the schema policy (`schema_policy.check_confined_schema`); `static_gate=False`
    skips both, for tests of the sandbox itself, which run code the gates would refuse to show
    that the OS layer holds without them. Every file is read without following a link out of
    the folder (`envfiles`)."""
    root = Path(root)
    if not root.is_dir():
        raise EnvLoadError([LoadProblem(root, None, "not a directory")])
    manifest = _load_manifest(root)
    policy_path = root / POLICY
    policy = read_env_text(root, POLICY) if env_file_exists(root, POLICY) else ""
    if not policy.strip():
        raise EnvLoadError([LoadProblem(policy_path, None, "policy.md is missing or empty")])
    schema_path = root / SCHEMA
    if not env_file_exists(root, SCHEMA):
        raise EnvLoadError([LoadProblem(schema_path, None, "schema.sql is missing")])
    schema_sql = read_env_text(root, SCHEMA)
    if manifest.trust == "confined" and static_gate:  # model-written: prepared and judged, never run
        check_confined_schema(schema_sql, schema_path)
    if manifest.trust == "confined":  # a model-written schema and seed: built in a bounded child
        from ..sandbox.schema_host import build_seed_bounded

        seed_db, tables = build_seed_bounded(root, manifest, schema_sql)
    else:
        seed_db, tables = build_seed(root, manifest, schema_sql)
    table_names = {t.name for t in tables}
    all_tools = _load_tools(root, manifest, table_names, static_gate=static_gate)
    unknown = [t for t in manifest.user_tables if t not in table_names]
    if unknown:
        raise EnvLoadError(
            [
                LoadProblem(
                    root / MANIFEST,
                    None,
                    f"user_tables names {', '.join(map(repr, unknown))}, which schema.sql does not define",
                )
            ]
        )
    return Environment(
        root=root,
        manifest=manifest,
        policy=policy,
        schema_sql=schema_sql,
        tools={n: s for n, s in all_tools.items() if s.side == "agent"},
        tables=tables,
        seed_db=seed_db,
        all_tools=all_tools,
    )
