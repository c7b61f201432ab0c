"""Import τ²-bench's telecom domain (dual control) into a `tau2_telecom` env folder.

Telecom differs from retail and airline in what a task is made of, so it has its own importer
(`import_tau2_env` hands a telecom folder over to `import_telecom_env`): two DBs (`db.toml`,
`user_db.toml`, converted by `telecom.py`), a policy τ² assembles from two files, gold actions
made by either side (`requestor`), an initial state per task set up by initialization actions,
and a reward read from env assertions (plus τ²'s action check for the tasks whose gold is a
transfer) instead of a DB hash.

A task's initialization runs as the env's own calls on an in-process episode: τ²'s
initialization methods are the port's side="setup" tools (three are tools of a side already,
`enable_roaming`, `disable_roaming`, `set_network_mode_preference`, and run as those), each
followed by τ²'s sync, as τ²'s `set_state` does. The state it leaves, diffed against the seed, is
the task's `setup`; the gold actions replayed from there give its golden state. Everything is
computed in a scratch folder first, so an initialization that fails (or any other refusal) leaves
the env folder untouched.
"""

from __future__ import annotations

import json
import re
import tempfile
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envforge.server import CallSide, Environment, Fleet, State, load_env, state_hash

from ..task.models import (
    ActionCheck,
    Call,
    CallNode,
    Dag,
    DagEdge,
    Difficulty,
    EnvAssertion,
    Fact,
    RewardPart,
    Task,
)
from ..task.statediff import cents_hash, primary_keys
from .importer import (
    ENV_CODE,
    TASK_SOURCE,
    TAU2_ANSWER_RULE,
    Tau2Import,
    Tau2ImportError,
    _check_target,
    _diff,
    _load_split_json,
    _load_tasks_json,
    _run_sync,
    _scenario,
    _source_file,
    _write_if_changed,
    seed_json_text,
    tools_json_mismatches,
)
from .telecom import TelecomDB, TelecomUserDB, load_telecom_toml, telecom_dbs_to_seed

ENV_NAME = "tau2_telecom"
PORT_DIR = Path(__file__).resolve().parent / ENV_NAME
#: τ²-bench's telecom folder as published (`tools.json` and `user_tools.json`, which a checkout
#: does not have, are optional cross-checks; `policy.md` is assembled from the two policy files).
TELECOM_FILES = (
    "db.toml",
    "user_db.toml",
    "main_policy.md",
    "tech_support_manual.md",
    "tasks.json",
    "split_tasks.json",
)
#: The split every generated task is in: tasks listed only there are not imported (see
#: `import_telecom_env`).
FULL_SPLIT = "full"
#: τ²'s reward-basis names in telecom and the envforge parts that judge the same thing.
TELECOM_REWARD_BASIS = {"ENV_ASSERTION": RewardPart.ENV_ASSERTIONS, "ACTION": RewardPart.ACTIONS}
#: τ²'s `env_type` names and the sides of the port's tools.
SIDES: dict[str, CallSide] = {"assistant": "agent", "user": "user"}
_PHONE = re.compile(r"\b\d{3}-\d{3}-\d{4}\b")


def is_telecom_folder(src_dir: Path) -> bool:
    """Whether `src_dir` looks like τ²'s telecom folder: a TOML DB (its user DB beside it), where
    the other domains have a db.json."""
    return (src_dir / "db.toml").is_file() and not (src_dir / "db.json").exists()


def telecom_policy(main_policy: str, manual: str) -> str:
    """The agent's policy exactly as τ²'s `get_environment()` assembles it (default, manual mode)."""
    return (
        "<main_policy>\n"
        + main_policy
        + "\n</main_policy>\n"
        + "<tech_support_policy>\n"
        + manual
        + "\n</tech_support_policy>"
    )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise Tau2ImportError(f"{path}: not UTF-8 text ({exc})") from exc


def _toml(path: Path, model: Any) -> dict[str, Any]:
    try:
        return load_telecom_toml(path, model)
    except UnicodeDecodeError as exc:
        raise Tau2ImportError(f"{path}: not UTF-8 text ({exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise Tau2ImportError(f"{path}: invalid TOML ({exc})") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise Tau2ImportError(f"{path}: not τ²'s {model.__name__} ({where}: {first['msg']})") from exc


def setup_side(env: Environment, env_type: str, func_name: str) -> CallSide:
    """The side whose tool runs τ²'s initialization method `func_name` of toolkit `env_type`:
    the setup tool of that name, else the tool of that name on the toolkit's own side."""
    if func_name in env.tools_of("setup"):
        return "setup"
    return SIDES.get(env_type, "agent")


def _function_calls(where: str, task_id: str, what: str, raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise Tau2ImportError(f"{where}: task {task_id}: {what} must be a list")
    for item in raw:
        if (
            not isinstance(item, dict)
            or item.get("env_type") not in SIDES
            or not isinstance(item.get("func_name"), str)
            or not isinstance(item.get("arguments", {}), dict)
        ):
            raise Tau2ImportError(
                f"{where}: task {task_id}: {what} entry {json.dumps(item)[:120]} is not "
                "{env_type: user|assistant, func_name, arguments}"
            )
    return raw


def _parse(where: str, raw: dict[str, Any], splits: dict[str, list[str]]) -> dict[str, Any]:
    """One τ² telecom task's fields, validated (nothing run yet)."""
    task_id = raw.get("id")
    if not isinstance(task_id, str):
        raise Tau2ImportError(f"{where}: a task has no string id: {json.dumps(raw)[:120]}")
    state = raw.get("initial_state") or {}
    if not isinstance(state, dict):
        raise Tau2ImportError(f"{where}: task {task_id}: initial_state must be an object")
    for unsupported in ("initialization_data", "message_history"):
        if state.get(unsupported):
            raise Tau2ImportError(f"{where}: task {task_id}: initial_state.{unsupported} is not supported")
    init = _function_calls(where, task_id, "initialization_actions", state.get("initialization_actions"))
    criteria = raw.get("evaluation_criteria")
    if not isinstance(criteria, dict):
        raise Tau2ImportError(f"{where}: task {task_id}: evaluation_criteria missing")
    calls: list[Call] = []
    checks: list[ActionCheck] = []
    for action in criteria.get("actions") or []:
        if not isinstance(action, dict) or not isinstance(action.get("name"), str):
            raise Tau2ImportError(f"{where}: task {task_id}: an action has no name")
        requestor = action.get("requestor", "assistant")
        if requestor not in SIDES:
            raise Tau2ImportError(f"{where}: task {task_id}: action requestor {requestor!r}")
        arguments = action.get("arguments") or {}
        if not isinstance(arguments, dict):
            raise Tau2ImportError(f"{where}: task {task_id}: action {action.get('action_id')} arguments")
        calls.append(Call(name=action["name"], arguments=arguments, requestor=requestor))
        checks.append(
            ActionCheck(name=action["name"], arguments=arguments, compare_args=action.get("compare_args"))
        )
    assertions = [
        EnvAssertion(
            env_type="agent" if a["env_type"] == "assistant" else "user",
            func_name=a["func_name"],
            arguments=a.get("arguments") or {},
            assert_value=a.get("assert_value", True),
            message=a.get("message"),
        )
        for a in _function_calls(where, task_id, "env_assertions", criteria.get("env_assertions"))
    ]
    basis: list[RewardPart] = []
    for part in criteria.get("reward_basis") or []:
        if part not in TELECOM_REWARD_BASIS:
            raise Tau2ImportError(
                f"{where}: task {task_id}: reward basis {part!r} has no envforge counterpart for telecom "
                f"(supported: {', '.join(TELECOM_REWARD_BASIS)})"
            )
        basis.append(TELECOM_REWARD_BASIS[part])
    if criteria.get("communicate_info") or criteria.get("nl_assertions"):
        raise Tau2ImportError(f"{where}: task {task_id}: communicate_info / nl_assertions are not supported")
    scenario = _scenario(where, task_id, raw.get("user_scenario"), [])
    known = (raw.get("user_scenario") or {}).get("instructions") or {}
    phones = _PHONE.findall(str(known.get("known_info") or "")) if isinstance(known, dict) else []
    if phones:
        facts = [*scenario.known_facts, Fact(name="phone_number", value=phones[0])]
        scenario = scenario.model_copy(update={"known_facts": facts})
    return {
        "id": task_id,
        "init": init,
        "calls": calls,
        "checks": checks if RewardPart.ACTIONS in basis else [],
        "assertions": assertions,
        "basis": basis,
        "scenario": scenario,
        "split": [name for name, ids in splits.items() if task_id in ids],
    }


def _call_text(env: Environment, call: Call) -> str:
    spec = env.all_tools.get(call.name)
    desc = spec.description.strip().split("\n")[0].rstrip(".") if spec else call.name
    who = "The user: " if call.requestor == "user" else ""
    args = "; ".join(f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in call.arguments.items())
    return f"{who}{desc} ({args})" if args else f"{who}{desc}"


async def _build_task(env: Environment, fleet: Fleet, seed: State, where: str, p: dict[str, Any]) -> Task:
    pks = primary_keys(env.tables)
    episode = await fleet.create_episode(env.name)
    try:
        for action in p["init"]:
            name, arguments = action["func_name"], action.get("arguments") or {}
            side = setup_side(env, action["env_type"], name)
            result = await fleet.call(episode.id, name, arguments, side=side)
            if result.is_error:
                raise Tau2ImportError(
                    f"{where}: task {p['id']}: initialization action {action['env_type']}.{name}"
                    f"({json.dumps(arguments)}) failed: {result.text}"
                )
        initial = await episode.export()
        nodes: list[CallNode] = []
        edges: list[DagEdge] = []
        writes = 0
        for i, call in enumerate(p["calls"]):
            result = await fleet.call(episode.id, call.name, call.arguments, side=SIDES[call.requestor])
            spec = env.all_tools.get(call.name)
            write = spec is not None and not spec.read_only
            writes += write and not result.is_error
            nodes.append(
                CallNode(
                    id=f"n{i}",
                    text=_call_text(env, call),
                    call=call,
                    write=write,
                    expect_error=result.is_error,
                )
            )
            if i:
                edges.append(DagEdge(source=f"n{i - 1}", target=f"n{i}", kind="control", label="then"))
        golden = await episode.export()
    finally:
        await fleet.close_episode(episode.id)
    golden_diff = _diff(pks, initial, golden)
    return Task(
        id=p["id"],
        env=env.name,
        seed=f"{TASK_SOURCE}:{p['id']}",
        dag=Dag(nodes=nodes, edges=edges),
        setup=_diff(pks, seed, initial),
        scenario=p["scenario"],
        golden_calls=p["calls"],
        golden_hash=state_hash(golden),
        golden_cents_hash=cents_hash(golden),
        golden_diff=golden_diff,
        required_outputs=[],
        checkpoints=[],
        difficulty=Difficulty(
            calls=len(nodes), writes=writes, reasoning=0, depth=len(nodes), tables=len(golden_diff)
        ),
        reward_basis=p["basis"],
        source=TASK_SOURCE,
        split=p["split"],
        action_checks=p["checks"],
        answer_rule=TAU2_ANSWER_RULE,
        env_assertions=p["assertions"],
    )


async def telecom_tasks_async(env: Environment, where: str, parsed: list[dict[str, Any]]) -> list[Task]:
    """Each parsed task with its setup (the initialization's changes) and golden state."""
    seed = env.seed_state()
    async with Fleet([env]) as fleet:
        return [await _build_task(env, fleet, seed, where, p) for p in parsed]


def _check_names(where: str, env: Environment, parsed: list[dict[str, Any]]) -> None:
    """Every name a task uses is one of the port's tools of the right side: the sign that
    tasks.json is telecom's."""
    for p in parsed:
        for action in p["init"]:
            side = setup_side(env, action["env_type"], action["func_name"])
            if env.tool_on(action["func_name"], side) is None:
                raise Tau2ImportError(
                    f"{where}: task {p['id']}: initialization action {action['env_type']}."
                    f"{action['func_name']} is not a method the {ENV_NAME} port has"
                )
        for call in p["calls"]:
            if env.tool_on(call.name, SIDES[call.requestor]) is None:
                raise Tau2ImportError(
                    f"{where}: task {p['id']}: gold action {call.name!r} is not a {call.requestor} tool "
                    f"of the {ENV_NAME} port (is this τ²-bench's telecom folder?)"
                )
        for a in p["assertions"]:
            if a.func_name not in env.tools_of("check"):
                raise Tau2ImportError(
                    f"{where}: task {p['id']}: env assertion {a.func_name!r} is not an assertion of the "
                    f"{ENV_NAME} port"
                )


def import_telecom_env(
    src_dir: Path, env_dir: Path, *, tasks: bool = True, strict_tools: bool = False
) -> Tau2Import:
    """Write the `tau2_telecom` env folder `env_dir` from τ²-bench's telecom folder `src_dir`.

    Reads the files τ² publishes (`TELECOM_FILES`); `tools.json` and `user_tools.json`, where
    present, are cross-checked against the port's agent and user tools. Imports the tasks of
    every split but `full` (τ²'s `base`, i.e. train and test, and `small`): the 2,171 tasks only
    `full` lists are generated variants τ²'s leaderboard does not run. Everything, the tasks'
    initializations and gold replays included, is computed in a scratch folder before anything
    is written to `env_dir`; re-running leaves the files byte-identical.
    """
    src_dir, env_dir = Path(src_dir), Path(env_dir)
    paths = {
        name: _source_file(src_dir, name) for name in TELECOM_FILES if tasks or not name.endswith(".json")
    }
    _check_target(env_dir, ENV_NAME)
    db = _toml(paths["db.toml"], TelecomDB)
    user_db = _toml(paths["user_db.toml"], TelecomUserDB)
    try:
        seed = telecom_dbs_to_seed(db, user_db)
    except ValueError as exc:
        raise Tau2ImportError(f"{paths['db.toml']}: cannot import ({exc})") from exc
    policy = telecom_policy(_read_text(paths["main_policy.md"]), _read_text(paths["tech_support_manual.md"]))
    with tempfile.TemporaryDirectory(prefix="envforge-tau2-telecom-") as tmp:
        scratch = Path(tmp) / ENV_NAME
        scratch.mkdir()
        files = {name: (PORT_DIR / name).read_bytes() for name in ENV_CODE}
        files["seed.json"] = seed_json_text(seed).encode("utf-8")
        files["policy.md"] = policy.encode("utf-8")
        for name, data in files.items():
            (scratch / name).write_bytes(data)
        env = load_env(scratch)
        mismatches: list[str] = []
        for name, tools in (("tools.json", env.tools), ("user_tools.json", env.tools_of("user"))):
            if (src_dir / name).is_file():
                mismatches += tools_json_mismatches(src_dir / name, tools)
        if mismatches and strict_tools:
            more = f" (and {len(mismatches) - 1} more)" if len(mismatches) > 1 else ""
            raise Tau2ImportError(f"{mismatches[0]}{more}")
        imported: list[Task] | None = None
        if tasks:
            where, raw_tasks = _load_tasks_json(paths["tasks.json"])
            split_where, splits = _load_split_json(paths["split_tasks.json"])
            ids = [t.get("id") for t in raw_tasks]
            dupes = sorted(str(i) for i, n in Counter(ids).items() if n > 1)
            if dupes:
                raise Tau2ImportError(f"{where}: duplicate task ids {dupes[:5]}")
            unknown = sorted({i for members in splits.values() for i in members} - set(map(str, ids)))
            if unknown:
                raise Tau2ImportError(
                    f"{split_where}: splits name task ids that {where} lacks: {unknown[:3]}"
                )
            chosen = {i for name, members in splits.items() if name != FULL_SPLIT for i in members}
            parsed = [_parse(where, raw, splits) for raw in raw_tasks if raw.get("id") in chosen]
            _check_names(where, env, parsed)
            imported = _run_sync(telecom_tasks_async(env, where, parsed))
            files["tasks.jsonl"] = "".join(t.model_dump_json() + "\n" for t in imported).encode("utf-8")
    env_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        _write_if_changed(env_dir / name, data)
    return Tau2Import(
        env_dir=env_dir,
        tasks=imported,
        tools_json=src_dir / "tools.json" if (src_dir / "tools.json").is_file() else None,
        tool_mismatches=mismatches,
    )
