"""The tau2_telecom env (dual control) against τ²-bench's own recorded behaviour.

Everything is checked against reference data produced by running τ²'s code (shared/tau2/telecom,
beside the repository, never copied into it): the 13 agent and 30 user tool schemas, both pristine
DB dumps and hashes, every train task's initialization (both hashes after it), every call of the
74 train gold replays (output text, error flag, both final hashes, the whole final user DB), the
24 edge-case calls, and the reward (env assertions, times the action check where τ²'s basis has
it) on the golds and on perturbed sequences whose τ² verdict follows from τ²'s semantics. Attacks:
a user tool used to change the carrier's DB, an initialization that fails, a folder missing a file.
"""

from __future__ import annotations

import inspect
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envforge import check_tasks, score_calls
from envforge.server import Environment, Fleet, State, load_env
from envforge.synth import (
    TELECOM_INITIAL_DB_HASH,
    TELECOM_INITIAL_USER_DB_HASH,
    Call,
    Task,
    Tau2ImportError,
    TelecomDB,
    TelecomUserDB,
    apply_diff,
    import_tau2_env,
    load_telecom_toml,
    primary_keys,
    tau2_db_hash,
    telecom_dbs_to_seed,
    telecom_state_to_tau2_db,
    telecom_state_to_tau2_user_db,
)

from support.paths import REPO, TAU2_RETAIL

TELECOM = TAU2_RETAIL.parent / "telecom"
NO_DATA = f"τ²-bench telecom reference data (outside the repo, not copyable into it) not found at {TELECOM}"
AGENT_WRITES = {
    "suspend_line",
    "resume_line",
    "send_payment_request",
    "enable_roaming",
    "disable_roaming",
    "refuel_data",
}
USER_WRITES = {
    "set_network_mode_preference",
    "toggle_airplane_mode",
    "reseat_sim_card",
    "toggle_data",
    "toggle_roaming",
    "toggle_data_saver_mode",
    "set_apn_settings",
    "reset_apn_settings",
    "toggle_wifi",
    "toggle_wifi_calling",
    "connect_vpn",
    "disconnect_vpn",
    "grant_app_permission",
    "reboot_device",
    "make_payment",
}
SIDE = {"assistant": "agent", "user": "user"}
AGENT_TABLES = ("plans", "customers", "lines", "bills", "devices")

pytestmark = pytest.mark.skipif(not (TELECOM / "tasks.json").is_file(), reason=NO_DATA)


def _jsonl(name: str) -> list[dict[str, Any]]:
    path = TELECOM / name
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


GOLD = _jsonl("gold_replays_train.jsonl")
EDGE_CASES = _jsonl("edge_case_outputs.jsonl")
GOLD_BY_ID = {g["task_id"]: g for g in GOLD}


def _params(rows: list[dict[str, Any]], key: str) -> list[Any]:
    if not rows:
        return [pytest.param(None, marks=pytest.mark.skip(reason=NO_DATA))]
    return [pytest.param(row, id=str(row[key])) for row in rows]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Environment, dict[str, Task]]:
    """The env imported with its tasks from τ²'s telecom folder as published, and loaded."""
    env_dir = tmp_path_factory.mktemp("tau2tel") / "tau2_telecom"
    tasks = import_tau2_env(TELECOM, env_dir).tasks
    assert tasks is not None
    return load_env(env_dir), {t.id: t for t in tasks}


@pytest.fixture(scope="module")
def env(imported: tuple[Environment, dict[str, Task]]) -> Environment:
    return imported[0]


@pytest.fixture(scope="module")
def tasks(imported: tuple[Environment, dict[str, Task]]) -> dict[str, Task]:
    return imported[1]


def initial_state(env: Environment, task: Task) -> State:
    return apply_diff(primary_keys(env.tables), env.seed_state(), task.setup)


async def run(
    env: Environment, state: State | None, calls: list[tuple[str, Any, str]]
) -> tuple[list[Any], State]:
    """`calls` ((name, arguments, requestor)) on their sides in one episode from `state`."""
    fleet = Fleet([env])
    try:
        episode = await fleet.create_episode(env.name, state=state)
        results = [await fleet.call(episode.id, n, a, side=SIDE[r]) for n, a, r in calls]  # type: ignore[arg-type]
        final = await episode.export()
    finally:
        await fleet.aclose()
    return results, final


def hashes(state: State) -> tuple[str, str]:
    return tau2_db_hash(telecom_state_to_tau2_db(state)), tau2_db_hash(telecom_state_to_tau2_user_db(state))


def _calls(actions: list[dict[str, Any]]) -> list[Call]:
    return [Call(name=a["name"], arguments=a["arguments"], requestor=a["requestor"]) for a in actions]


# --------------------------------------------------------------------------- tools and data


def test_tool_schemas_equal_tau2(env: Environment) -> None:
    """Both toolkits: names in τ²'s order, descriptions, parameter schemas (key order too)."""
    for name, tools in (("tools.json", env.tools), ("user_tools.json", env.tools_of("user"))):
        listed = json.loads((TELECOM / name).read_text(encoding="utf-8"))
        assert list(tools) == [t["function"]["name"] for t in listed], name
        for t in listed:
            f = t["function"]
            spec = tools[f["name"]]
            assert spec.description == f["description"], f["name"]
            assert json.dumps(spec.input_schema) == json.dumps(f["parameters"]), f["name"]
    assert {n for n, s in env.tools.items() if not s.read_only} == AGENT_WRITES
    assert {n for n, s in env.tools_of("user").items() if not s.read_only} == USER_WRITES
    for name, spec in env.tools_of("user").items():  # the carrier's tables only through sync
        assert set(spec.writes) <= {"device", "surroundings", "bills"}, name
    assert not set(env.tools) & set(env.tools_of("user")), "a name on both sides"


def test_pristine_dbs_are_tau2s_model_dumps(env: Environment) -> None:
    """Independently of the importer: τ²'s own dumps of the TOML files, their hashes, and the seed
    state exported back to exactly them."""
    db = load_telecom_toml(TELECOM / "db.toml", TelecomDB)
    user_db = load_telecom_toml(TELECOM / "user_db.toml", TelecomUserDB)
    assert db == json.loads((TELECOM / "db_dump.json").read_text(encoding="utf-8"))
    assert user_db == json.loads((TELECOM / "user_db_dump.json").read_text(encoding="utf-8"))
    assert tau2_db_hash(db) == TELECOM_INITIAL_DB_HASH
    assert tau2_db_hash(user_db) == TELECOM_INITIAL_USER_DB_HASH
    seed = env.seed_state()
    assert telecom_state_to_tau2_db(seed) == db
    assert telecom_state_to_tau2_user_db(seed) == user_db
    assert set(telecom_dbs_to_seed(db, user_db)) == {t.name for t in env.tables}
    assert env.manifest.user_tables == ["device", "surroundings", "phone_defaults"]


def test_port_columns_are_the_models_fields(env: Environment) -> None:
    """tools.py reads and writes the columns the conversion's models name, in model order."""
    code = sys.modules[inspect.getmodule(env.tools["get_customer_by_id"].fn).__name__]  # type: ignore[union-attr]
    db = load_telecom_toml(TELECOM / "db.toml", TelecomDB)
    user_db = load_telecom_toml(TELECOM / "user_db.toml", TelecomUserDB)
    assert {t: tuple(db[t][0]) for t in AGENT_TABLES} == code.AGENT_COLUMNS
    assert {t: tuple(user_db[t]) for t in ("device", "surroundings")} == code.USER_COLUMNS
    columns = {t.name: list(t.columns) for t in env.tables}
    for table, fields in {**code.AGENT_COLUMNS, **code.USER_COLUMNS}.items():
        assert [c for c in columns[table] if c not in ("position", "id")] == list(fields), table


def test_splits_and_reward_bases(tasks: dict[str, Task]) -> None:
    """Every task of τ²'s named splits (not the 2,171 only `full` lists), basis mapped part by part."""
    splits = json.loads((TELECOM / "split_tasks.json").read_text(encoding="utf-8"))
    assert set(tasks) == set(splits["base"]) | set(splits["small"])
    for gold in GOLD:
        task = tasks[gold["task_id"]]
        assert "train" in task.split
        want = {"ENV_ASSERTION": "env_assertions", "ACTION": "actions"}
        assert task.reward_basis == [want[p] for p in gold["reward_basis"]]
        assert [a.func_name for a in task.env_assertions] == [a["func_name"] for a in gold["env_assertions"]]
        assert [c.requestor for c in task.golden_calls] == [a["requestor"] for a in gold["actions"]]
        assert bool(task.action_checks) == ("ACTION" in gold["reward_basis"])


# --------------------------------------------------------------------------- τ²'s replays


@pytest.mark.parametrize("gold", _params(GOLD, "task_id"))
async def test_gold_replay(env: Environment, tasks: dict[str, Task], gold: dict[str, Any]) -> None:
    """From the task's imported initial state: both hashes after initialization, each output byte
    for byte with its error flag, both final hashes and the whole final user DB."""
    task = tasks[gold["task_id"]]
    start = initial_state(env, task)
    assert hashes(start) == (gold["post_init_db_hash"], gold["post_init_user_db_hash"])
    assert telecom_state_to_tau2_user_db(start) == gold["post_init_user_db"]
    results, final = await run(
        env, start, [(a["name"], a["arguments"], a["requestor"]) for a in gold["actions"]]
    )
    for i, result in enumerate(results):
        where = f"action {i} {gold['actions'][i]['name']}"
        assert result.is_error == gold["output_is_error"][i], f"{where}: {result.text}"
        assert result.text == gold["outputs"][i], where
    assert hashes(final) == (gold["final_db_hash"], gold["final_user_db_hash"])
    assert telecom_state_to_tau2_user_db(final) == gold["final_user_db"]
    assert (tau2_db_hash(telecom_state_to_tau2_db(final)) != gold["post_init_db_hash"]) == gold["db_changed"]


@pytest.mark.parametrize("case", _params(EDGE_CASES, "case"))
async def test_edge_case(env: Environment, tasks: dict[str, Task], case: dict[str, Any]) -> None:
    start = initial_state(env, tasks[case["initialized_with_task"]])
    (result,), final = await run(env, start, [(case["name"], case["arguments"], case["requestor"])])
    assert result.is_error == case["output_is_error"], result.text
    assert result.text == case["output"], case["case"]
    assert (telecom_state_to_tau2_db(final) != telecom_state_to_tau2_db(start)) == case["db_changed"]
    assert (telecom_state_to_tau2_user_db(final) != telecom_state_to_tau2_user_db(start)) == case[
        "user_db_changed"
    ]


async def test_solo_mode_reaches_tau2s_end_states(env: Environment, tasks: dict[str, Task]) -> None:
    """τ²'s solo mode: the agent makes every call, the user's included (its tools are the agent's
    followed by the user's). Each gold played that way gives τ²'s outputs and final hashes."""
    fleet = Fleet([env])
    try:
        for gold in GOLD:
            episode = await fleet.create_episode(env.name, state=initial_state(env, tasks[gold["task_id"]]))
            texts = [
                (await fleet.call(episode.id, a["name"], a["arguments"], side="solo")).text
                for a in gold["actions"]
            ]
            assert texts == gold["outputs"], gold["task_id"]
            assert hashes(await episode.export()) == (gold["final_db_hash"], gold["final_user_db_hash"])
            await fleet.close_episode(episode.id)
    finally:
        await fleet.aclose()


# --------------------------------------------------------------------------- verdicts


def test_gold_rewards_equal_tau2s(env: Environment, tasks: dict[str, Task]) -> None:
    """`envforge score`'s reward on every gold is τ²'s (1.0: every gold meets its assertions)."""
    for gold in GOLD:
        score = score_calls(env, tasks[gold["task_id"]], _calls(gold["actions"]))
        assert score.reward == gold["evaluator_check"]["reward"], gold["task_id"]
        assert not score.not_judged, gold["task_id"]


def _variant(task_id: str, edit: Any) -> tuple[str, list[dict[str, Any]]]:
    actions = [dict(a) for a in GOLD_BY_ID[task_id]["actions"]]
    return task_id, edit(actions)


AIRPLANE_ROAMING = "[mobile_data_issue]airplane_mode_on|user_abroad_roaming_enabled_off[PERSONA:None]"


def _first(prefix: str, has: str) -> str:
    return next(
        g["task_id"]
        for g in GOLD
        if g["task_id"].startswith(prefix) and any(a["name"] == has for a in g["actions"])
    )


def perturbations() -> list[tuple[str, str, list[dict[str, Any]], float]]:
    """(label, task, actions, τ²'s reward), each reward argued from τ²'s semantics."""
    refuel = _first("[mobile_data_issue]", "refuel_data")
    overdue = _first("[service_issue]", "make_payment")
    transfer = next(g["task_id"] for g in GOLD if "ACTION" in g["reward_basis"])
    vpn = _first("[mobile_data_issue]", "disconnect_vpn")
    out: list[tuple[str, str, list[dict[str, Any]], float]] = []

    def add(label: str, task_id: str, edit: Any, reward: float) -> None:
        out.append((label, *_variant(task_id, edit), reward))

    # Turning airplane mode off and roaming on commute: the same end state, data works abroad.
    add("reorder the two toggles", AIRPLANE_ROAMING, lambda a: a[::-1], 1.0)
    # Without roaming on, data does not work abroad: assert_mobile_data_status(True) fails.
    add("drop toggle_roaming", AIRPLANE_ROAMING, lambda a: a[:1], 0.0)
    # A second toggle puts airplane mode back on: no service.
    add("duplicate toggle_airplane_mode", AIRPLANE_ROAMING, lambda a: [a[0], *a], 0.0)
    # τ²: a user tool is not found by the agent (`Error: Tool ... not found.`), so nothing changes.
    add(
        "user call sent as assistant",
        AIRPLANE_ROAMING,
        lambda a: [{**a[0], "requestor": "assistant"}, a[1]],
        0.0,
    )
    # assert_data_refueling_amount wants the gold's amount: 1 GB less fails it.
    add(
        "change the refuel amount",
        refuel,
        lambda a: [
            {**x, "arguments": {**x["arguments"], "gb_amount": x["arguments"]["gb_amount"] - 1}}
            if x["name"] == "refuel_data"
            else x
            for x in a
        ],
        0.0,
    )
    # Without the payment the overdue bill stays unpaid: assert_no_overdue_bill fails.
    add("drop make_payment", overdue, lambda a: [x for x in a if x["name"] != "make_payment"], 0.0)
    # The transfer's compare_args is []: any summary matches by name.
    add(
        "change the transfer summary",
        transfer,
        lambda a: [{**x, "arguments": {"summary": "something else"}} for x in a],
        1.0,
    )
    # The ACTION basis needs the transfer, whatever the state.
    add("drop the transfer", transfer, lambda a: [], 0.0)
    # The user's phone may not act on the carrier's DB: a refuel asked of the user is not found.
    add(
        "agent call sent as user",
        refuel,
        lambda a: [{**x, "requestor": "user"} if x["name"] == "refuel_data" else x for x in a],
        0.0,
    )
    # After break_vpn the default VPN is poor for the rest of the episode: reconnecting does not
    # fix the speed (τ²'s shared default), so the excellent-speed assertion fails.
    add(
        "reconnect the broken VPN",
        vpn,
        lambda a: [
            *[x for x in a if x["name"] not in ("disconnect_vpn",)],
            {"name": "disconnect_vpn", "arguments": {}, "requestor": "user"},
            {"name": "connect_vpn", "arguments": {}, "requestor": "user"},
        ],
        0.0,
    )
    return out


@pytest.mark.parametrize(("label", "task_id", "actions", "reward"), perturbations() if GOLD else [])
def test_perturbed_rewards_equal_tau2s(
    env: Environment,
    tasks: dict[str, Task],
    label: str,
    task_id: str,
    actions: list[dict[str, Any]],
    reward: float,
) -> None:
    score = score_calls(env, tasks[task_id], _calls(actions))
    assert score.reward == reward, f"{label}: {score}"


async def test_user_tool_argument_errors_name_the_user_toolkit(
    env: Environment, tasks: dict[str, Task]
) -> None:
    """τ² calls the user's tools as methods of `TelecomUserTools`: Python's TypeError names it."""
    start = initial_state(env, tasks[AIRPLANE_ROAMING])
    (missing, unexpected), final = await run(
        env, start, [("grant_app_permission", {}, "user"), ("toggle_data", {"on": True}, "user")]
    )
    assert missing.text == (
        "Error: TelecomUserTools.grant_app_permission() missing 2 required positional arguments: "
        "'app_name' and 'permission'"
    )
    assert unexpected.text == "Error: TelecomUserTools.toggle_data() got an unexpected keyword argument 'on'"
    assert final == start


async def test_user_call_sent_as_assistant_is_not_found(env: Environment, tasks: dict[str, Task]) -> None:
    """τ²: an assistant call to a user tool is simply not found, and changes nothing."""
    start = initial_state(env, tasks[AIRPLANE_ROAMING])
    (result,), final = await run(env, start, [("toggle_data", {}, "assistant")])
    assert (result.is_error, result.text) == (True, "Error: Tool 'toggle_data' not found.")
    assert final == start


def test_self_checks_judge_env_assertions(env: Environment, tasks: dict[str, Task]) -> None:
    """`envforge check` on every train task: its replays run a user's golden call on the user's
    tools, and its reward checks judge the env assertions (and the calls made, where τ²'s basis has
    ACTION) as an eval does. Every gold earns 1, doing nothing and dropping a write earn 0, no
    adversary earns a task. Only the transfers fail, on `not_presatisfied` alone (their gold leaves
    the state as initialized, by τ²'s design), and there `read_all`, whose reads hold the transfer,
    is the gold with extra reads: not judged. The results realism reads are τ²'s outputs."""
    chosen = [tasks[g["task_id"]] for g in GOLD]
    transfers = {t.id for t in chosen if not t.golden_diff}
    assert transfers and all("actions" in tasks[i].reward_basis for i in transfers)
    for verdict in check_tasks(env, chosen):
        transfer = verdict.task_id in transfers
        assert verdict.failed_checks == (["not_presatisfied"] if transfer else []), verdict
        assert verdict.gamed_by == [], verdict
        assert verdict.adversary_rewards["read_all"] == (None if transfer else 0.0), verdict
        assert verdict.golden_results == GOLD_BY_ID[verdict.task_id]["outputs"]  # what realism reads


# --------------------------------------------------------------------------- attacks


USER_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("set_network_mode_preference", {"mode": "2g_only"}),
    ("toggle_airplane_mode", {}),
    ("reseat_sim_card", {}),
    ("toggle_data", {}),
    ("toggle_roaming", {}),
    ("toggle_data_saver_mode", {}),
    ("set_apn_settings", {"apn_settings": {"apn_name": "broken", "mmsc_url": None}}),
    ("reset_apn_settings", {}),
    ("toggle_wifi", {}),
    ("toggle_wifi_calling", {}),
    ("connect_vpn", {}),
    ("disconnect_vpn", {}),
    ("grant_app_permission", {"app_name": "browser", "permission": "sms"}),
    ("reboot_device", {}),
    ("make_payment", {}),
]


async def test_user_tools_cannot_change_the_carriers_db(env: Environment, tasks: dict[str, Task]) -> None:
    """The attack: a user works every write tool of their phone, twice, to change the carrier's
    records (their line's roaming, usage, status). Only sync's coupling reaches that DB, and with
    no payment request pending it changes nothing there: the agent-side dump stays as it was,
    while the user's own DB does change."""
    task_id = _first("[mobile_data_issue]", "refuel_data")
    start = initial_state(env, tasks[task_id])
    assert telecom_state_to_tau2_user_db(start)["surroundings"]["payment_request"] is None
    results, final = await run(env, start, [(n, a, "user") for n, a in USER_CALLS * 2])
    assert not any(r.is_error for r in results), [r.text for r in results if r.is_error]
    assert telecom_state_to_tau2_db(final) == telecom_state_to_tau2_db(start)
    assert telecom_state_to_tau2_user_db(final) != telecom_state_to_tau2_user_db(start)


async def test_only_a_paid_request_reaches_the_carriers_db(env: Environment, tasks: dict[str, Task]) -> None:
    """τ²'s coupling, and nothing more: after the agent's payment request, the user's payment
    marks exactly that bill Paid (and clears the request); no other record of the carrier moves."""
    overdue = _first("[service_issue]", "make_payment")
    gold = GOLD_BY_ID[overdue]
    before_pay = [a for a in gold["actions"] if a["name"] != "make_payment"]
    _, unpaid = await run(
        env,
        initial_state(env, tasks[overdue]),
        [(a["name"], a["arguments"], a["requestor"]) for a in before_pay],
    )
    (paid,), final = await run(env, unpaid, [("make_payment", {}, "user")])
    assert not paid.is_error and paid.text.startswith("Payment of ")
    bill_id = telecom_state_to_tau2_user_db(unpaid)["surroundings"]["payment_request"]["bill_id"]
    old, new = telecom_state_to_tau2_db(unpaid), telecom_state_to_tau2_db(final)
    changed = {
        (table, i)
        for table in AGENT_TABLES
        for i, (a, b) in enumerate(zip(old[table], new[table], strict=True))
        if a != b
    }
    (where,) = changed
    assert new[where[0]][where[1]] == {**old[where[0]][where[1]], "status": "Paid"}
    assert new["bills"][where[1]]["bill_id"] == bill_id
    assert telecom_state_to_tau2_user_db(final)["surroundings"]["payment_request"] is None


def _small_folder(tmp: Path, edit: Any = None, drop: str | None = None) -> Path:
    """A copy of τ²'s telecom folder with two tasks (one train, one test), `edit`ed, less `drop`."""
    src = tmp / "telecom"
    src.mkdir()
    for f in TELECOM.iterdir():
        if f.name not in ("tasks.json", "split_tasks.json", drop) and f.suffix in (".toml", ".md"):
            shutil.copy(f, src / f.name)
    splits = json.loads((TELECOM / "split_tasks.json").read_text(encoding="utf-8"))
    ids = [GOLD[0]["task_id"], splits["test"][0]]
    chosen = [t for t in json.loads((TELECOM / "tasks.json").read_text(encoding="utf-8")) if t["id"] in ids]
    if edit is not None:
        edit(chosen)
    if drop != "tasks.json":
        (src / "tasks.json").write_text(json.dumps(chosen), encoding="utf-8")
    (src / "split_tasks.json").write_text(
        json.dumps({"train": ids[:1], "test": ids[1:], "full": ids}), encoding="utf-8"
    )
    return src


def test_failing_initialization_is_refused(tmp_path: Path) -> None:
    """The attack: a task whose initialization cannot run (usage set on a line that is not the
    customer's). τ² raises there; the import refuses with one line naming the task and the action,
    and writes nothing."""

    def break_init(chosen: list[dict[str, Any]]) -> None:
        chosen[1]["initial_state"]["initialization_actions"].append(
            {
                "env_type": "assistant",
                "func_name": "set_data_usage",
                "arguments": {"customer_id": "C1001", "line_id": "L1004", "data_used_gb": 1.0},
            }
        )

    src = _small_folder(tmp_path, break_init)
    env_dir = tmp_path / "out" / "tau2_telecom"
    with pytest.raises(Tau2ImportError) as caught:
        import_tau2_env(src, env_dir)
    message = str(caught.value)
    assert "\n" not in message
    assert "initialization action assistant.set_data_usage" in message
    assert "Line L1004 not found for customer C1001" in message
    assert json.loads((src / "tasks.json").read_text())[1]["id"] in message
    assert not env_dir.exists()


@pytest.mark.parametrize("missing", ["user_db.toml", "tech_support_manual.md", "tasks.json"])
def test_folder_missing_a_file_is_refused(tmp_path: Path, missing: str) -> None:
    """One line naming the missing file, a non-zero exit, no traceback, nothing written."""
    src = _small_folder(tmp_path, drop=missing)
    env_dir = tmp_path / "out" / "tau2_telecom"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "envforge"), "import", "tau2", str(src), "-o", str(env_dir)],
        capture_output=True,
        text=True,
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": "/usr/bin:/bin", "COLUMNS": "400"},
        cwd=REPO,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr + done.stdout
    lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
    assert len(lines) == 1 and missing in lines[0], lines
    assert not env_dir.exists()


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("db.toml", "[[plans]\n", "invalid TOML"),
        (
            "user_db.toml",
            "[device]\nairplane_mode = 'sometimes'\n",
            "not τ²'s TelecomUserDB (device.airplane_mode",
        ),
    ],
)
def test_malformed_db_is_refused(tmp_path: Path, name: str, text: str, said: str) -> None:
    """A DB τ²'s models would not load is one error line naming the file, and nothing is written."""
    src = _small_folder(tmp_path)
    (src / name).write_text(text, encoding="utf-8")
    env_dir = tmp_path / "out" / "tau2_telecom"
    with pytest.raises(Tau2ImportError) as caught:
        import_tau2_env(src, env_dir)
    assert "\n" not in str(caught.value) and name in str(caught.value) and said in str(caught.value)
    assert not env_dir.exists()


def test_small_import_writes_setup_and_is_idempotent(tmp_path: Path) -> None:
    """A clean import of the two-task folder: the train task's setup reproduces τ²'s state after
    initialization, and importing again rewrites nothing."""
    src = _small_folder(tmp_path)
    env_dir = tmp_path / "out" / "tau2_telecom"
    found = import_tau2_env(src, env_dir).tasks
    assert found is not None and [t.split for t in found] == [["train", "full"], ["test", "full"]]
    env = load_env(env_dir)
    start = initial_state(env, found[0])
    assert hashes(start) == (GOLD[0]["post_init_db_hash"], GOLD[0]["post_init_user_db_hash"])
    stamps = {p.name: p.stat().st_mtime_ns for p in env_dir.iterdir()}
    import_tau2_env(src, env_dir)
    assert {p.name: p.stat().st_mtime_ns for p in env_dir.iterdir()} == stamps


# --------------------------------------------------------------------------- the command line


def test_cli_replay_and_score_equal_tau2(
    imported: tuple[Environment, dict[str, Task]], tmp_path: Path
) -> None:
    """`envforge replay --task --export tau2 --json` and `envforge score` on a gold with user calls
    and a payment: τ²'s outputs, both hashes and reward."""
    env, _ = imported
    gold = GOLD_BY_ID[_first("[service_issue]", "make_payment")]
    actions = tmp_path / "actions.json"
    actions.write_text(json.dumps(gold["actions"]), encoding="utf-8")
    cli = str(Path(sys.executable).parent / "envforge")
    common = {
        "capture_output": True,
        "text": True,
        "cwd": REPO,
        "env": {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": "/usr/bin:/bin"},
    }
    replayed = subprocess.run(
        [
            cli,
            "replay",
            str(env.root),
            "--task",
            gold["task_id"],
            "--actions",
            str(actions),
            "--export",
            "tau2",
            "--json",
        ],
        **common,  # type: ignore[call-overload]
    )
    assert replayed.returncode == 0, replayed.stderr
    out = json.loads(replayed.stdout)
    assert out["outputs"] == gold["outputs"] and out["errors"] == gold["output_is_error"]
    assert tau2_db_hash(out["tau2_db"]) == gold["final_db_hash"]
    assert tau2_db_hash(out["tau2_user_db"]) == gold["final_user_db_hash"]
    scored = subprocess.run(
        [cli, "score", str(env.root), "--task", gold["task_id"], "--actions", str(actions), "--json"],
        **common,  # type: ignore[call-overload]
    )
    assert scored.returncode == 0, scored.stderr
    assert json.loads(scored.stdout)["reward"] == gold["evaluator_check"]["reward"] == 1.0
