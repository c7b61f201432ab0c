"""The tau2_airline env against τ²-bench's own recorded behaviour.

Everything is checked against reference data produced by running τ²'s code (shared/tau2/airline,
beside the repository, never copied into it): the 14 tool schemas, the initial DB hash, every
call of the 30 train-split gold replays (output text, error flag, changed records, final hash),
the 30 edge-case calls, and envforge's DB verdict against τ²'s hash rule on perturbed gold
sequences (dropped, changed, duplicated and reordered writes, stray writes, a wrong payment method).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from envforge.server import Environment, Fleet, load_env
from envforge.synth import (
    AIRLINE_INITIAL_DB_HASH,
    Task,
    Tau2ImportError,
    airline_db_to_seed,
    import_tau2_env,
    primary_keys,
    score_episode,
    state_to_tau2_db,
    tau2_db_hash,
)

from support.paths import TAU2_RETAIL

AIRLINE = TAU2_RETAIL.parent / "airline"
NO_DATA = f"τ²-bench airline reference data (outside the repo, not copyable into it) not found at {AIRLINE}"
PORT_CODE = ("env.toml", "schema.sql", "tools.py")
WRITES = {
    "book_reservation",
    "cancel_reservation",
    "send_certificate",
    "update_reservation_baggages",
    "update_reservation_flights",
    "update_reservation_passengers",
}

pytestmark = pytest.mark.skipif(not (AIRLINE / "tasks.json").is_file(), reason=NO_DATA)


def _jsonl(name: str) -> list[dict[str, Any]]:
    path = AIRLINE / name
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


GOLD = _jsonl("gold_replays_train.jsonl")
EDGE_CASES = _jsonl("edge_case_outputs.jsonl")


def _params(rows: list[dict[str, Any]], key: str) -> list[Any]:
    if not rows:
        return [pytest.param(None, marks=pytest.mark.skip(reason=NO_DATA))]
    return [pytest.param(row, id=str(row[key])) for row in rows]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Environment, dict[str, Task]]:
    """The env imported with its tasks from τ²'s airline folder as published, and loaded."""
    env_dir = tmp_path_factory.mktemp("tau2air") / "tau2_airline"
    tasks = import_tau2_env(AIRLINE, env_dir).tasks
    assert tasks is not None
    return load_env(env_dir), {t.id: t for t in tasks}


@pytest.fixture(scope="module")
def env(imported: tuple[Environment, dict[str, Task]]) -> Environment:
    return imported[0]


@pytest.fixture(scope="module")
def initial_db(env: Environment) -> dict[str, Any]:
    return state_to_tau2_db(env.seed_state())


async def _run(env: Environment, calls: list[tuple[str, Any]]) -> tuple[list[Any], Any]:
    fleet = Fleet([env])
    try:
        episode = await fleet.create_episode(env.name)
        results = [await fleet.call(episode.id, name, args) for name, args in calls]
        state = await episode.export()
    finally:
        await fleet.aclose()
    return results, state


def changed_records(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """τ²'s db_diff: {table: {key: record_after}} for records whose dump changed (or are new)."""
    diff: dict[str, dict[str, Any]] = {}
    for table in ("flights", "users", "reservations"):
        keys = before[table].keys() | after[table].keys()
        changed = {
            k: after[table].get(k) for k in sorted(keys) if before[table].get(k) != after[table].get(k)
        }
        if changed:
            diff[table] = changed
    return diff


def test_tool_schemas_equal_tau2(env: Environment) -> None:
    tools = json.loads((AIRLINE / "tools.json").read_text(encoding="utf-8"))
    assert list(env.tools) == [t["function"]["name"] for t in tools]
    for t in tools:
        f = t["function"]
        spec = env.tools[f["name"]]
        assert spec.description == f["description"], f["name"]
        assert spec.input_schema == f["parameters"], f["name"]
        assert json.dumps(spec.input_schema) == json.dumps(f["parameters"]), f["name"]  # key order too
    assert {name for name, spec in env.tools.items() if not spec.read_only} == WRITES


def test_initial_state_is_tau2s_model_dump(env: Environment, initial_db: dict[str, Any]) -> None:
    """Independently of the importer: db.json plus `"status": null` per reservation is what τ² dumps
    and hashes; the seed holds exactly what the canonical export gives back."""
    raw = json.loads((AIRLINE / "db.json").read_text(encoding="utf-8"))
    assert tau2_db_hash(raw) != AIRLINE_INITIAL_DB_HASH
    for reservation in raw["reservations"].values():
        reservation["status"] = None
    assert initial_db == raw
    assert tau2_db_hash(initial_db) == AIRLINE_INITIAL_DB_HASH
    seed = airline_db_to_seed(raw)
    state = env.seed_state()
    for table, rows in seed.items():
        key = next(t for t in env.tables if t.name == table).primary_key
        assert sorted(rows, key=lambda r: tuple(r[c] for c in key)) == state[table], table


@pytest.mark.parametrize("task", _params(GOLD, "task_id"))
async def test_gold_replay(env: Environment, initial_db: dict[str, Any], task: dict[str, Any]) -> None:
    """Each output byte for byte, each error flag, the changed records and τ²'s final hash."""
    results, state = await _run(env, [(a["name"], a["arguments"]) for a in task["actions"]])
    for i, result in enumerate(results):
        where = f"task {task['task_id']} action {i} {task['actions'][i]['name']}"
        assert result.is_error == task["output_is_error"][i], f"{where}: {result.text}"
        assert result.text == task["outputs"][i], where
    final = state_to_tau2_db(state)
    assert changed_records(initial_db, final) == task["db_diff"]
    assert tau2_db_hash(final) == task["final_db_hash"]
    assert (tau2_db_hash(final) != AIRLINE_INITIAL_DB_HASH) == task["db_changed"]


@pytest.mark.parametrize("case", _params(EDGE_CASES, "case"))
async def test_edge_case(env: Environment, case: dict[str, Any]) -> None:
    (result,), state = await _run(env, [(case["name"], case["arguments"])])
    assert result.is_error == case["output_is_error"], result.text
    assert result.text == case["output"], case["case"]
    assert (state != env.seed_state()) == case["db_changed"]


# --------------------------------------------------------------------------- verdicts


def _writes(actions: list[dict[str, Any]]) -> list[int]:
    return [i for i, a in enumerate(actions) if a["name"] in WRITES]


def _other_reservation(initial_db: dict[str, Any], actions: list[dict[str, Any]]) -> str:
    """A reservation no gold action names: cancelling it is a stray write."""
    named = {a["arguments"].get("reservation_id") for a in actions}
    return next(r for r in initial_db["reservations"] if r not in named)


def perturbations(task: dict[str, Any], initial_db: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Variants of a gold action list: each write dropped, changed and duplicated, the writes
    reversed, and a stray write (cancelling an unrelated reservation, a certificate) appended."""
    actions = [{"name": a["name"], "arguments": a["arguments"]} for a in task["actions"]]
    out: list[tuple[str, list[dict[str, Any]]]] = [("gold", actions)]
    writes = _writes(actions)
    for i in writes:
        out.append((f"drop {i}", actions[:i] + actions[i + 1 :]))
        out.append((f"duplicate {i}", [*actions[: i + 1], actions[i], *actions[i + 1 :]]))
        changed = json.loads(json.dumps(actions[i]))
        args = changed["arguments"]
        if "payment_id" in args:
            args["payment_id"] = "credit_card_0000000"
        elif "amount" in args:
            args["amount"] = int(args["amount"]) + 1
        elif args.get("passengers"):
            args["passengers"][0]["dob"] = "1900-01-01"
        elif "nonfree_baggages" in args:
            args["nonfree_baggages"] = int(args["nonfree_baggages"]) + 1
        else:
            args["reservation_id"] = _other_reservation(initial_db, actions)
        out.append((f"change {i}", [*actions[:i], changed, *actions[i + 1 :]]))
    if len(writes) > 1:
        order = [a for i, a in enumerate(actions) if i not in writes] + [actions[i] for i in reversed(writes)]
        out.append(("reorder writes", order))
    user = next(iter(initial_db["users"]))
    out.append(
        (
            "stray cancel",
            [
                *actions,
                {
                    "name": "cancel_reservation",
                    "arguments": {"reservation_id": _other_reservation(initial_db, actions)},
                },
            ],
        )
    )
    out.append(
        (
            "stray certificate",
            [*actions, {"name": "send_certificate", "arguments": {"user_id": user, "amount": 50}}],
        )
    )
    out.append(("reads only", [a for a in actions if a["name"] not in WRITES]))
    return out


async def test_verdicts_equal_tau2s_on_perturbed_sequences(
    imported: tuple[Environment, dict[str, Task]], initial_db: dict[str, Any]
) -> None:
    """envforge's DB verdict (`state_match`) against τ²'s rule on the same end state: its hash
    equals the gold's `final_db_hash` from τ²'s own replay. On every train task and every variant;
    and the variants must fail as well as pass, or the test would show nothing."""
    env, tasks = imported
    keys = primary_keys(env.tables)
    verdicts: dict[bool, int] = {True: 0, False: 0}
    for gold in GOLD:
        task = tasks[gold["task_id"]]
        for label, actions in perturbations(gold, initial_db):
            _, state = await _run(env, [(a["name"], a["arguments"]) for a in actions])
            ours = score_episode(task, state, [], keys=keys).state_match
            theirs = tau2_db_hash(state_to_tau2_db(state)) == gold["final_db_hash"]
            assert ours == theirs, f"task {gold['task_id']}, {label}: envforge {ours}, τ² {theirs}"
            verdicts[theirs] += 1
    assert verdicts[True] >= len(GOLD) and verdicts[False] >= 3 * len(GOLD), verdicts


async def test_write_with_wrong_payment_method_is_refused_as_tau2(
    env: Environment, initial_db: dict[str, Any]
) -> None:
    """The attack: pay with a method that is not the user's (another user's card), or a certificate
    where τ² refuses one. τ² refuses each with its own message and changes nothing, so a task whose
    gold makes that write is failed."""
    mia = initial_db["users"]["mia_li_3668"]
    other_card = next(
        m
        for uid, u in initial_db["users"].items()
        if uid != "mia_li_3668"
        for m, d in u["payment_methods"].items()
        if d["source"] == "credit_card"
    )
    certificate = next(m for m, d in mia["payment_methods"].items() if d["source"] == "certificate")
    flights = [
        {"flight_number": "HAT136", "date": "2024-05-20"},
        {"flight_number": "HAT039", "date": "2024-05-20"},
    ]
    booking = {
        "user_id": "mia_li_3668",
        "origin": "JFK",
        "destination": "SEA",
        "flight_type": "one_way",
        "cabin": "economy",
        "flights": flights,
        "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
        "payment_methods": [{"payment_id": other_card, "amount": 255}],
        "total_baggages": 0,
        "nonfree_baggages": 1,
        "insurance": "no",
    }
    results, state = await _run(
        env,
        [
            ("book_reservation", booking),
            (
                "update_reservation_baggages",
                {
                    "reservation_id": "NO6JO3",
                    "total_baggages": 3,
                    "nonfree_baggages": 2,
                    "payment_id": other_card,
                },
            ),
            (
                "update_reservation_baggages",
                {
                    "reservation_id": "NO6JO3",
                    "total_baggages": 3,
                    "nonfree_baggages": 2,
                    "payment_id": certificate,
                },
            ),
        ],
    )
    assert [r.text for r in results] == [
        f"Error: Payment method {other_card} not found",
        "Error: Payment method not found",
        "Error: Certificate cannot be used to update reservation",
    ]
    assert all(r.is_error for r in results)
    assert tau2_db_hash(state_to_tau2_db(state)) == AIRLINE_INITIAL_DB_HASH


async def test_failed_booking_changes_nothing_and_ids_stay_tau2s(env: Environment) -> None:
    """A refused booking takes no id, seat or balance; the next booking gets τ²'s first id, and a
    certificate paid with is removed from the user whatever its remaining balance."""
    base = {
        "user_id": "mia_li_3668",
        "origin": "JFK",
        "destination": "SEA",
        "flight_type": "one_way",
        "cabin": "economy",
        "flights": [{"flight_number": "HAT136", "date": "2024-05-20"}],
        "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
        "total_baggages": 0,
        "nonfree_baggages": 0,
        "insurance": "no",
    }
    results, state = await _run(
        env,
        [
            (
                "book_reservation",
                {**base, "payment_methods": [{"payment_id": "certificate_7504069", "amount": 1}]},
            ),
            (
                "book_reservation",
                {**base, "payment_methods": [{"payment_id": "certificate_7504069", "amount": 152}]},
            ),
        ],
    )
    assert results[0].text == "Error: Payment amount does not add up, total price is 152, but paid 1"
    assert json.loads(results[1].text)["reservation_id"] == "HATHAT", results[1].text
    db = state_to_tau2_db(state)
    assert "certificate_7504069" not in db["users"]["mia_li_3668"]["payment_methods"]
    assert db["users"]["mia_li_3668"]["reservations"][-1] == "HATHAT"


def test_import_recognises_the_domain_and_refuses_other_input(env: Environment, tmp_path: Path) -> None:
    """Airline is recognised from db.json alone; a re-import is byte-identical; a retail env folder
    is not overwritten; a db.json of no known domain, or airline data with retail's tasks, is one
    error and nothing is written."""
    before = {n: (env.root / n).read_bytes() for n in (*PORT_CODE, "seed.json", "policy.md", "tasks.jsonl")}
    import_tau2_env(AIRLINE, env.root)
    assert {n: (env.root / n).read_bytes() for n in before} == before
    retail_env = tmp_path / "retail_env"
    retail_env.mkdir()
    (retail_env / "env.toml").write_text('name = "tau2_retail"\ndescription = "x"\n', encoding="utf-8")
    with pytest.raises(Tau2ImportError, match=r"holds another env .* names 'tau2_retail'"):
        import_tau2_env(AIRLINE, retail_env, tasks=False)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("policy.md", "tasks.json", "split_tasks.json"):
        (src / name).symlink_to(AIRLINE / name)
    (src / "db.json").write_text(json.dumps({"flights": {}, "customers": {}}), encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(Tau2ImportError, match=r"db\.json: not a τ² domain this importer knows"):
        import_tau2_env(src, out)
    assert not out.exists()
    (src / "db.json").unlink()
    (src / "db.json").symlink_to(AIRLINE / "db.json")
    (src / "tasks.json").unlink()
    (src / "tasks.json").symlink_to(TAU2_RETAIL / "tasks.json")
    with pytest.raises(Tau2ImportError, match=r"is not a tool of the tau2_airline port"):
        import_tau2_env(src, out)
    assert not out.exists()


def test_cli_replay_exports_tau2_shape(env: Environment, tmp_path: Path) -> None:
    """`envforge replay --export tau2 --json` on a booking gold: τ²'s outputs and τ²'s final hash."""
    import os
    import subprocess
    import sys

    gold = next(g for g in GOLD if g["task_id"] == "23")
    actions = tmp_path / "actions.json"
    actions.write_text(
        json.dumps([{"name": a["name"], "arguments": a["arguments"]} for a in gold["actions"]])
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "envforge.cli",
            "replay",
            str(env.root),
            "--actions",
            str(actions),
            "--json",
            "--export",
            "tau2",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        check=True,
    )
    out = json.loads(proc.stdout)
    assert out["outputs"] == gold["outputs"] and out["errors"] == gold["output_is_error"]
    assert tau2_db_hash(out["tau2_db"]) == gold["final_db_hash"]


def test_cli_import_of_unknown_input_is_one_line(tmp_path: Path) -> None:
    """`envforge import tau2` on a folder whose db.json is no known domain: one error line, a
    non-zero exit, no traceback, and no env folder."""
    import os
    import subprocess
    import sys

    src = tmp_path / "telecom_like"
    src.mkdir()
    (src / "db.json").write_text(json.dumps({"customers": [], "lines": []}), encoding="utf-8")
    (src / "policy.md").write_text("policy\n", encoding="utf-8")
    out = tmp_path / "envs" / "tau2_x"
    proc = subprocess.run(
        [sys.executable, "-m", "envforge.cli", "import", "tau2", str(src), "-o", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "COLUMNS": "400"},
    )
    assert proc.returncode != 0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "not a τ² domain this importer knows" in lines[0], lines
    assert "Traceback" not in proc.stderr
    assert not out.exists()
