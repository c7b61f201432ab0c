"""`envforge serve`, `inspect`, `replay`: the runtime issue's commands."""

from __future__ import annotations

import json
import os
import textwrap
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import typer
from pydantic import BaseModel
from rich.table import Table

from envforge.server import Environment, Fleet, read_actions, replay

from .common import console, fail, fail_setting, load_envs, print_json, results
from .schema_text import parameter_lines

if TYPE_CHECKING:
    from envforge import HttpServer


class Transport(StrEnum):
    stdio = "stdio"
    http = "http"


class ExportFormat(StrEnum):
    tau2 = "tau2"


ANNOUNCED_ENVS = 10
"""A fleet of more envs announces the first few and a count, not a line per env."""


def serve(
    env_dirs: Annotated[list[Path], typer.Argument(help="Env folders to serve.")],
    transport: Annotated[
        Transport | None,
        typer.Option(
            help="stdio: one env, one episode; http: a fleet. Default: stdio when stdin is a pipe (an "
            "MCP client launched the server, whatever flags its launcher passed on), one env is given "
            "and neither --host nor --port; otherwise http.",
            show_default=False,
        ),
    ] = None,
    host: Annotated[str | None, typer.Option(help="HTTP bind address [default: 127.0.0.1].")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (0 picks a free one) [default: 8000].")] = None,
    token: Annotated[
        str | None,
        typer.Option(envvar="ENVFORGE_TOKEN", help="Control-plane bearer token (required off loopback)."),
    ] = None,
    max_episodes: Annotated[int, typer.Option(help="Most episodes open at once.")] = 4096,
    max_episodes_per_client: Annotated[
        int,
        typer.Option(help="Most episodes one client (bearer token, else remote address) may hold open."),
    ] = 1024,
    max_episode_mib_per_client: Annotated[
        int,
        typer.Option(
            help="Most MiB of episode databases one client may hold (each counts twice its starting "
            "database and 1 MiB to grow)."
        ),
    ] = 4096,
    max_sessions_per_client: Annotated[
        int,
        typer.Option(
            help="Most legacy MCP sessions one client (bearer token, else remote address) may hold open."
        ),
    ] = 1024,
    ttl: Annotated[float, typer.Option(help="Seconds an idle episode lives.")] = 1800.0,
    max_connections: Annotated[
        int, typer.Option(help="Most open client connections (also kept under the file-descriptor limit).")
    ] = 4096,
    max_connections_per_client: Annotated[
        int | None,
        typer.Option(
            help="Most open connections from one client address (default: half of --max-connections)."
        ),
    ] = None,
    header_timeout: Annotated[
        float, typer.Option(help="Seconds a client may take to send request headers.")
    ] = 10.0,
    body_timeout: Annotated[
        float, typer.Option(help="Seconds a client may stall while sending a body.")
    ] = 30.0,
    body_deadline: Annotated[
        float, typer.Option(help="Seconds a client may take to send a whole body, however it trickles.")
    ] = 120.0,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body accepted (413 above).")] = 16
    << 20,
    sqlite_work_mib: Annotated[
        int,
        typer.Option(
            envvar="ENVFORGE_SQLITE_WORK_MIB",
            help="MiB of memory SQL statements may use beyond the open episodes' databases: SQLite's "
            "hard heap limit for the server, which refuses a call whose statement needs more.",
        ),
    ] = 256,
    workers: Annotated[
        int,
        typer.Option(
            help="HTTP: serving processes behind the one address, each with its own episodes (a front "
            "process routes each episode's requests to its owner; docs/scaling.md).",
        ),
    ] = 1,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="HTTP: run the --workers on a Ray cluster ('auto', or the head's HOST:PORT), each in an "
            "actor on any node, behind this one address (the `ray` extra; docs/scaling.md).",
        ),
    ] = None,
) -> None:
    """Serve environments over MCP (stdio for desktop clients, streamable HTTP for fleets)."""
    import envforge

    try:
        envforge.sqlite_work_bytes(sqlite_work_mib)
    except envforge.SettingError as exc:
        fail_setting(exc)
    envs = load_envs(env_dirs)
    if transport is None:
        launched = len(envs) == 1 and host is None and port is None and envforge.launched_over_pipes()
        transport = Transport.stdio if launched else Transport.http
        if launched:
            console.print(
                f"serving {envs[0].name} over stdio (stdin is a pipe: an MCP client launched it; "
                "--transport http or --port to serve over HTTP)",
                highlight=False,
            )
    if transport is Transport.stdio:
        if workers != 1 or ray is not None:
            flag = "--workers" if workers != 1 else "--ray"
            fail(f"{flag} is for HTTP: stdio serves one env to one client")
        if len(envs) != 1:
            fail("stdio serves exactly one env")
        envforge.serve_env_stdio(envs[0], sqlite_work_mib=sqlite_work_mib)
        return
    host = "127.0.0.1" if host is None else host
    port = 8000 if port is None else port
    if workers < 1:
        fail("--workers must be >= 1")
    try:
        limits = envforge.ServeLimits(
            max_episodes=max_episodes,
            max_episodes_per_client=max_episodes_per_client,
            max_episode_mib_per_client=max_episode_mib_per_client,
            max_sessions_per_client=max_sessions_per_client,
            ttl=ttl,
            max_connections=max_connections,
            max_connections_per_client=max_connections_per_client,
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            body_deadline=body_deadline,
            max_body_bytes=max_body_bytes,
            sqlite_work_mib=sqlite_work_mib,
        )
        if workers > 1 or ray is not None:
            _serve_workers(env_dirs, [env.name for env in envs], workers, host, port, token, limits, ray)
            return
        server = envforge.http_server(envs, host=host, port=port, token=token, limits=limits)
    except envforge.SettingError as exc:
        fail_setting(exc)
    except OSError as exc:
        fail(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} "
            "(is another server using it? pick another --port, or --port 0 for a free one)"
        )
    except (ValueError, RuntimeError) as exc:  # off loopback without a token; SQLite without a heap limit
        fail(str(exc))
    server.run(on_listening=lambda: announce(server, [env.name for env in envs]))


def _serve_workers(
    env_dirs: list[Path],
    names: list[str],
    workers: int,
    host: str,
    port: int,
    token: str | None,
    limits: Any,
    ray_address: str | None,
) -> None:
    """`serve --workers N [--ray ADDRESS]`: a front on `host:port` and N worker processes behind it
    (on this machine, or in Ray actors on the cluster's nodes)."""
    from envforge import listening_socket, sqlite_work_bytes
    from envforge.server import build_front, serve_http

    app, _ = build_front(
        [str(d.resolve()) for d in env_dirs],
        workers,
        host=host,
        token=token,
        max_episodes=limits.max_episodes,
        max_episodes_per_client=limits.max_episodes_per_client,
        max_episode_bytes_per_client=limits.max_episode_mib_per_client << 20,
        max_sessions_per_client=limits.max_sessions_per_client,
        ttl=limits.ttl,
        max_body_bytes=limits.max_body_bytes,
        body_timeout=limits.body_timeout,
        body_deadline=limits.body_deadline,
        sqlite_work_bytes=sqlite_work_bytes(limits.sqlite_work_mib),
        ray_address=ray_address,
    )
    sock = listening_socket(host, port)
    bound = sock.getsockname()[1]

    def listening() -> None:
        shown = names if len(names) <= ANNOUNCED_ENVS else names[: ANNOUNCED_ENVS - 1]
        for name in shown:
            console.print(f"[green]serving[/] {name}: http://{host}:{bound}/envs/{name}/mcp")
        where = f" in Ray actors (cluster {ray_address})" if ray_address else ""
        console.print(
            f"{workers} worker processes{where}; control plane: http://{host}:{bound}/control/episodes"
        )

    serve_http(app, host=host, port=bound, limits=limits.http_limits(), sock=sock, on_listening=listening)


def mcp(
    env_dir: Annotated[Path, typer.Argument(help="Env folder.")],
    sqlite_work_mib: Annotated[
        int,
        typer.Option(
            envvar="ENVFORGE_SQLITE_WORK_MIB",
            help="MiB of memory SQL statements may use beyond the episode's database.",
        ),
    ] = 256,
) -> None:
    """Serve one env over stdio, one episode for the life of the process: the command to give an MCP
    client that launches servers (no transport flag for a launcher to take as its own)."""
    import envforge

    try:
        envforge.sqlite_work_bytes(sqlite_work_mib)
    except envforge.SettingError as exc:
        fail_setting(exc)
    (env,) = load_envs([env_dir])
    envforge.serve_env_stdio(env, sqlite_work_mib=sqlite_work_mib)


def announce(server: HttpServer, names: list[str]) -> None:
    """Where each env is served (a long fleet: the first few and a count) and the control plane."""
    shown = names if len(names) <= ANNOUNCED_ENVS else names[: ANNOUNCED_ENVS - 1]
    for name in shown:
        console.print(f"[green]serving[/] {name}: {server.url(name)}")
    if len(shown) < len(names):
        more = len(names) - len(shown)
        console.print(f"[green]serving[/] {more} more envs (GET /control/envs lists all {len(names)})")
    console.print(f"control plane: http://{server.host}:{server.port}/control/episodes")


def inspect(
    env_dir: Annotated[Path, typer.Argument(help="Env folder.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Show an env's tools with their schemas and its tables with row counts."""
    (env,) = load_envs([env_dir])
    seed = env.seed_state()  # the export the seed hash is taken from: the rows the tables hold
    counts = {t.name: len(seed[t.name]) for t in env.tables}
    if json_out:
        print_json(
            {
                "name": env.name,
                "version": env.manifest.version,
                "tools": [
                    {
                        "name": s.name,
                        "read_only": s.read_only,
                        "writes": list(s.writes),
                        "description": s.description,
                        "input_schema": s.input_schema,
                    }
                    for s in env.tools.values()
                ],
                "tables": [
                    {
                        "name": t.name,
                        "columns": list(t.columns),
                        "primary_key": list(t.primary_key),
                        "rows": counts[t.name],
                    }
                    for t in env.tables
                ],
                "seed_hash": env.seed_hash(),
            }
        )
        return
    out = results
    out.print(f"[bold]{env.name}[/] {env.manifest.version}: {len(env.tools)} tools", highlight=False)
    for spec in env.tools.values():
        kind = "read" if spec.read_only else f"writes {', '.join(spec.writes)}"
        out.print(f"\n[bold]{spec.name}[/] ({kind})", highlight=False)
        out.print(wrapped(spec.description, out.width, "  "), markup=False, highlight=False)
        for line in parameter_lines(spec.input_schema, set(spec.required)):
            out.print(wrapped(line, out.width, "    ", "      "), markup=False, highlight=False)
    tables = Table(title=f"{env.name}: tables", title_justify="left")
    for col in ("table", "primary key", "columns", "rows"):
        tables.add_column(col, no_wrap=col == "table")
    for t in env.tables:
        tables.add_row(t.name, ", ".join(t.primary_key), str(len(t.columns)), str(counts[t.name]))
    out.print()
    out.print(tables)
    out.print(f"seed state hash: {env.seed_hash()}", highlight=False)


def wrapped(text: str, width: int, indent: str, subsequent: str | None = None) -> str:
    """`text` wrapped at word boundaries to `width`: whole descriptions, never cut mid-word.

    Paragraphs (blank-line separated) stay apart; words longer than a line are left whole."""
    paragraphs = [" ".join(p.split()) for p in text.strip().split("\n\n") if p.strip()]
    return "\n".join(
        textwrap.fill(
            p,
            width=max(width, 40),
            initial_indent=indent,
            subsequent_indent=subsequent if subsequent is not None else indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
        for p in paragraphs
    )


def replay_command(
    env_dir: Annotated[Path, typer.Argument(help="Env folder.")],
    actions: Annotated[
        Path,
        typer.Option(
            "--actions", help='JSON list of {name, arguments}; a user\'s call adds "requestor": "user".'
        ),
    ],
    task_id: Annotated[
        str | None, typer.Option("--task", help="Start from this task's initial state (tasks.jsonl).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    export: Annotated[
        ExportFormat | None, typer.Option(help="Also export the final state in another shape.")
    ] = None,
) -> None:
    """Run ACTIONS in order in one fresh episode through the in-process MCP server.

    With --task, or with a call of the user's (dual control: τ² telecom), the episode starts from
    the task's initial state (else the seed) and each call runs on its requestor's side, in process."""
    (env,) = load_envs([env_dir])
    try:
        parsed = read_actions(actions)
        requestors = _requestors(actions)
    except ValueError as exc:
        fail(str(exc))
    result: Any
    if task_id is None and "user" not in requestors:
        fleet = Fleet([env])
        result = anyio.run(lambda: replay(fleet, env.name, parsed))
    else:
        result = _replay_from_task(env, env_dir, task_id, parsed, requestors)
    payload = result.model_dump()
    if export is ExportFormat.tau2:
        from envforge.synth import state_to_tau2_db

        try:
            payload["tau2_db"] = state_to_tau2_db(result.final_state)
            if "surroundings" in result.final_state:
                from envforge.synth import telecom_state_to_tau2_user_db

                payload["tau2_user_db"] = telecom_state_to_tau2_user_db(result.final_state)
        except KeyError as exc:
            fail(
                f"--export tau2 needs a τ² retail, airline or telecom env (made by `envforge import tau2`); "
                f"{env.name} has no {exc.args[0]!r} table"
            )
    if json_out:
        print_json(payload)
        return
    out = results
    for action, text, err in zip(parsed, result.outputs, result.errors, strict=True):
        style = "red" if err else "green"
        out.print(f"[{style}]{action.name}[/] {action.arguments}\n  -> {text[:300]}")
    out.print(f"state hash: {result.state_hash}")


def _requestors(path: Path) -> list[str]:
    """Each action's requestor ("assistant" unless it says "user"); read_actions has vetted the file."""
    found = []
    for i, item in enumerate(json.loads(path.read_text(encoding="utf-8"))):
        requestor = item.get("requestor", "assistant") if isinstance(item, dict) else "assistant"
        if requestor not in ("assistant", "user"):
            raise ValueError(f"{path}: entry {i}: requestor must be 'assistant' or 'user', got {requestor!r}")
        found.append(requestor)
    return found


class _Replayed(BaseModel):
    """What `replay` gives (its ReplayResult's fields), for a replay run in process."""

    outputs: list[str]
    errors: list[bool]
    final_state: dict[str, list[dict[str, Any]]]
    state_hash: str


def _replay_from_task(
    env: Environment, env_dir: Path, task_id: str | None, actions: list[Any], requestors: list[str]
) -> _Replayed:
    """The actions run in process on their requestors' sides, from the task's initial state."""
    from envforge import run_episode
    from envforge.synth import Call, apply_diff, load_tasks, primary_keys

    state = None
    if task_id is not None:
        task = next((t for t in load_tasks(env_dir) if t.id == task_id), None)
        if task is None:
            fail(f"no task {task_id!r} in {env_dir / 'tasks.jsonl'}")
        if task.setup:
            state = apply_diff(primary_keys(env.tables), env.seed_state(), task.setup)
    calls = [
        Call(name=a.name, arguments=a.arguments, requestor="user" if r == "user" else "assistant")
        for a, r in zip(actions, requestors, strict=True)
    ]
    run = run_episode(env, calls, state=state)
    return _Replayed(
        outputs=[r.text for r in run.results],
        errors=[r.is_error for r in run.results],
        final_state=run.state,
        state_hash=run.state_hash,
    )


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("mcp")(mcp)
    app.command("inspect")(inspect)
    app.command("replay")(replay_command)


os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
