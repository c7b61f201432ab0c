"""Tasks that vary, and users cast in a role that may ask for what they ask (issue 36, item 5).

The attacks, as a new user met them: `synth tasks envs/gym --n 10 --seed 7` gave eight tasks of
ten reading "You want to freeze your membership", and pharmacy patients asked to "restock drug
D-204 with quantity 30", a write the env's policy says acts for no patient. Measured with the
measures `envforge check` prints (`measure_diversity`), on real synthesis runs of the bundled envs.
"""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from pathlib import Path

import pytest

from envforge import synthesize_tasks
from envforge.server import load_env
from envforge.synth import (
    STAFF,
    SynthConfig,
    Task,
    intent_of,
    load_graph,
    load_policy_rules,
    load_tasks,
    measure_diversity,
    roles_of,
    tasks_jsonl,
)

from support.paths import ENVS, bundled_env_dirs


@pytest.fixture(autouse=True)
def _quiet_runtime() -> None:
    logging.getLogger("envforge.server.runtime").setLevel(logging.CRITICAL)


def run(env: str, n: int, seed: int, **config: bool) -> list[Task]:
    return synthesize_tasks(ENVS / env, n, seed=seed, config=SynthConfig(**config)).tasks


def writes(task: Task) -> tuple[str, ...]:
    return tuple(sorted({n.call.name for n in task.dag.nodes if n.kind == "call" and n.write}))


def test_gym_seed_7_no_longer_asks_for_one_thing_eight_times_in_ten() -> None:
    tasks = run("gym", 10, 7)
    env_dir = ENVS / "gym"
    d = measure_diversity("gym", tasks, roles_of(load_env(env_dir), load_graph(env_dir)))
    freeze_only = sum(1 for t in tasks if writes(t) == ("freeze_membership",))
    assert freeze_only <= 3, [t.scenario.instruction.splitlines()[0] for t in tasks]
    assert d.first_window >= 5 and d.top_share <= 0.3, d


@pytest.mark.parametrize("env", ["gym", "pharmacy", "car_rental"])
def test_any_ten_tasks_in_a_row_cover_several_intents(env: str) -> None:
    """The cap: no intent more than three times in any ten in a row, so at least four intents."""
    tasks = run(env, 30, 7)
    env_dir = ENVS / env
    roles = roles_of(load_env(env_dir), load_graph(env_dir))
    intents = [intent_of(t, roles) for t in tasks]
    for i in range(len(intents) - 9):
        assert max(Counter(intents[i : i + 10]).values()) <= 3, (i, intents[i : i + 10])
    assert measure_diversity(env, tasks, roles).window_min >= 4


def test_a_fresh_pharmacy_run_casts_staff_to_restock_and_patients_for_their_prescriptions() -> None:
    tasks = run("pharmacy", 20, 7)
    restocks = [t for t in tasks if "restock_drug" in writes(t)]
    theirs = [t for t in tasks if {"fill_prescription", "cancel_prescription"} & set(writes(t))]
    assert restocks and theirs
    for t in restocks:  # a restock acts for no patient: a member of staff asks for it, alone
        assert t.dag.principal is None and writes(t) == ("restock_drug",), t.scenario.instruction
        assert t.scenario.persona.startswith("A member of staff"), t.scenario.persona
    for t in theirs:
        assert t.dag.principal is not None and t.dag.principal.table == "patients"
        assert "restock_drug" not in writes(t)


@pytest.mark.parametrize("env_dir", bundled_env_dirs(), ids=lambda p: p.name)
def test_every_bundled_task_s_user_may_ask_for_its_writes_per_the_env_policy(env_dir: Path) -> None:
    """A task with a principal never asks for a write the policy's identity rule exempts (one that
    acts for no principal); a task without one asks only for such writes."""
    env = load_env(env_dir)
    tasks = load_tasks(env_dir)
    roles = roles_of(env, load_graph(env_dir))
    assert [(t.id, roles.mismatches(t)) for t in tasks if roles.mismatches(t)] == []
    rules = load_policy_rules(env)
    exempt = set(rules.declared.identity.exempt) if rules and rules.declared.identity else set()
    for t in tasks:
        if t.dag.principal is not None:
            assert not exempt & set(writes(t)), (t.id, writes(t))
        else:
            assert set(writes(t)) <= roles.staff_writes, (t.id, writes(t))


def test_roles_come_from_the_policy_and_else_from_the_tools_parameters(tmp_path: Path) -> None:
    def roles(env_dir: Path) -> tuple[str | None, set[str], bool]:
        r = roles_of(load_env(env_dir), load_graph(env_dir))
        return r.principal_role, set(r.staff_writes), r.declared

    assert roles(ENVS / "pharmacy") == ("patient", {"restock_drug"}, True)
    assert roles(ENVS / "car_rental") == ("customer", {"send_to_maintenance"}, True)
    assert roles(ENVS / "gym") == ("member", set(), True)
    assert roles(ENVS / "helpdesk_lite") == ("agent", set(), False)  # no identity rule: parameters
    # Without its policy rules, pharmacy's restock still names no patient's row: staff's.
    bare = tmp_path / "pharmacy"
    shutil.copytree(ENVS / "pharmacy", bare, ignore=shutil.ignore_patterns("policy_rules.toml"))
    assert roles(bare) == ("patient", {"restock_drug"}, False)


def test_the_same_seed_gives_the_same_bytes_whatever_ran_before() -> None:
    first = tasks_jsonl(run("gym", 12, 7))
    run("pharmacy", 10, 3)
    run("gym", 10, 8)
    assert tasks_jsonl(run("gym", 12, 7)) == first


def test_steering_off_keeps_the_roles() -> None:
    """`vary=False` turns the intent steering off, never the roles: no patient restocks."""
    env_dir = ENVS / "pharmacy"
    roles = roles_of(load_env(env_dir), load_graph(env_dir))
    tasks = run("pharmacy", 20, 7, vary=False)
    assert not [t.id for t in tasks if roles.mismatches(t)]
    assert {roles.role_of(t.dag.principal) for t in tasks} == {"patient", STAFF}
