"""The seed stage fills in a `generate()` skeleton written from the schema, the tools stage's
`writes=` follows its own SQL, and the prompts' examples stay out of the answers.

Each is a failure the packaged Qwen2.5-Coder-1.5B made on the corpus's Petstore set
(`tests/fixtures/envsynth/captured_petstore_1.5b`): asked for a JSON seed of 100 rows it wrote 7,
then 21 (the load gate's "seed has 21 rows; at least 100"); it kept the skeleton's comment about
`writes=` on every tool and declared none, though createUser inserts into `users`; and its schema
held `orders` and `messages` tables the docs never name, copied from the schema prompt's examples.
Everything the model writes stays gated: the generator passes the seed allowlist and runs confined.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from envforge.server import SEED_IMPORTS, check_python, load_env
from envforge.synth.envsynth import (
    ReplayResponder,
    SynthSettings,
    left_placeholders,
    load_doc_set,
    load_recordings,
    reference_problems,
    rejected_dir,
    repair_hints,
    run_seed_generator,
    schema_as_kept,
    seed_skeleton,
    strip_fences,
    synthesize_env,
    tools_skeleton,
    with_awaited_db_calls,
    with_declared_writes,
)

from support.envsynth_asked import Asked
from support.paths import ENVSYNTH_FIXTURES, REPO

CORPUS = REPO / "benchmarks" / "envsynth_corpus"
PETSTORE_15B = ENVSYNTH_FIXTURES / "captured_petstore_1.5b_signatures"


async def _petstore_run(tmp_path: Path) -> tuple[Asked, Path]:
    docs = load_doc_set(CORPUS, CORPUS / "openapi_petstore_users" / "docs")
    asked = Asked(PETSTORE_15B)
    await synthesize_env(docs, tmp_path / "petstore", asked, SynthSettings(name="petstore", max_rounds=0))
    return asked, rejected_dir(tmp_path / "petstore") / "rejected_candidate"


def _filled(skeleton: str) -> str:
    """The skeleton with every `...` written as a value unique per row, as an answer would."""
    return skeleton.replace("...", 'f"v{i}"')


async def test_the_seed_stage_is_given_a_generator_that_makes_every_row(tmp_path: Path) -> None:
    asked, _ = await _petstore_run(tmp_path)
    schema = strip_fences(load_recordings(PETSTORE_15B)["schema:0"])
    skeleton = seed_skeleton(schema, 100)
    assert skeleton is not None and f"```python\n{skeleton}```" in asked.prompts["seed:0"]
    assert check_python(skeleton, imports=SEED_IMPORTS) == []
    rows = await run_seed_generator(_filled(skeleton))
    assert sum(len(v) for v in rows.values()) >= 100  # the JSON answer had 7, then 21
    assert set(rows) == {"users", "orders", "messages"}
    # the rows load into the schema: every key distinct, every NOT NULL and UNIQUE kept
    root = tmp_path / "env"
    root.mkdir()
    (root / "env.toml").write_text('name = "env"\ndescription = "d"\nversion = "0.1.0"\nseed = "seed.json"\n')
    (root / "schema.sql").write_text(schema)
    (root / "seed.json").write_text(json.dumps(rows))
    (root / "policy.md").write_text("# Policy\n")
    tool = '@tool\nasync def t(db: Db) -> int:\n    """T."""\n    return 1\n'
    (root / "tools.py").write_text(f"from envforge.server import Db, tool\n\n\n{tool}")
    assert sum(len(v) for v in load_env(root).seed_state().values()) >= 100


async def test_references_are_drawn_from_the_rows_they_name() -> None:
    schema = (
        "CREATE TABLE shelf (code TEXT PRIMARY KEY, label TEXT NOT NULL);\n"
        "CREATE TABLE book (id INTEGER PRIMARY KEY, shelf_code TEXT NOT NULL REFERENCES shelf(code),"
        " title TEXT UNIQUE);\n"
    )
    skeleton = seed_skeleton(schema, 100)
    assert skeleton is not None
    assert "rng.choice(shelf_rows)['code']" in skeleton
    assert skeleton.index("shelf_rows = []") < skeleton.index("book_rows = []")
    rows = await run_seed_generator(_filled(skeleton))
    codes = {r["code"] for r in rows["shelf"]}
    assert rows["book"] and all(r["shelf_code"] in codes for r in rows["book"])


async def test_a_value_left_as_the_placeholder_is_named_by_the_static_gate(tmp_path: Path) -> None:
    schema = strip_fences(load_recordings(PETSTORE_15B)["schema:0"])
    skeleton = seed_skeleton(schema, 100)
    assert skeleton is not None
    half = skeleton.replace("'username': ...", "'username': f\"user{i}\"")
    recordings = {**load_recordings(PETSTORE_15B), "seed:0": f"```python\n{half}```"}
    path = tmp_path / "responses.json"
    path.write_text(json.dumps({"note": "petstore, seed left half done", "responses": recordings}))
    docs = load_doc_set(CORPUS, CORPUS / "openapi_petstore_users" / "docs")
    settings = SynthSettings(name="petstore", max_rounds=0)
    replay = ReplayResponder.from_path(path)
    report = await synthesize_env(docs, tmp_path / "b" / "petstore", replay, settings)
    static = report.rounds[0].gates[0]
    assert "seed" in static.blame
    left = [p for p in static.problems if "a value is still `...`" in p]
    assert left and all(p.startswith("seed generator line ") for p in left)
    assert not any("'username'" in p for p in left) and any("'email'" in p for p in left)


def test_a_tool_whose_sql_writes_declares_what_it_writes() -> None:
    # captured (the 1.5B's tools.py of an earlier Petstore run, `captured_petstore_1.5b`):
    # `@tool  # a tool that changes rows: @tool(writes=["table_a"])` over createUser, whose body
    # inserts into users: a read tool by its decorator, refused when it wrote; the users table is
    # the one the model's later schema holds (`captured_petstore_1.5b_signatures`)
    answer = strip_fences(load_recordings(ENVSYNTH_FIXTURES / "captured_petstore_1.5b")["tools:0"])
    schema = strip_fences(load_recordings(PETSTORE_15B)["schema:0"])
    tables = set(re.findall(r"CREATE TABLE (\w+)", schema))
    before = dict((name, dec) for dec, name in re.findall(r"(@tool[^\n]*)\n(?:async )?def (\w+)", answer))
    assert before["createUser"].startswith("@tool  #")  # declared nothing
    tools_py = with_declared_writes(answer, tables)
    by_tool = dict((name, dec) for dec, name in re.findall(r"(@tool[^\n]*)\n(?:async )?def (\w+)", tools_py))
    assert by_tool["createUser"].startswith('@tool(writes=["users"])')
    assert by_tool["updateUser"].startswith('@tool(writes=["users"])')
    assert by_tool["getUserByName"] == before["getUserByName"]  # it only reads
    assert check_python(tools_py) == check_python(answer)


def test_writes_are_only_ever_tables_the_schema_has_and_the_sql_names() -> None:
    tools_py = (
        "from envforge.server import Db, tool\n\n\n"
        "@tool\nasync def a(db: Db) -> None:\n"
        '    await db.execute("DELETE FROM sqlite_master")\n'
        '    await db.execute("UPDATE notes SET x = 1")\n\n\n'
        '@tool(writes=["notes"])\nasync def b(db: Db) -> None:\n    return None\n\n\n'
        "@tool\nasync def c(db: Db) -> str:\n"
        '    return "UPDATE notes is what b would do"  # not SQL it runs, but named: declared\n'
    )
    out = with_declared_writes(tools_py, {"notes"})
    assert '@tool(writes=["notes"])\nasync def a' in out
    assert "sqlite_master" not in out.split("async def a")[0]
    assert '@tool(writes=["notes"])\nasync def b' in out
    assert check_python(out) == []
    assert with_declared_writes("def broken(:\n", {"notes"}) == "def broken(:\n"


async def test_the_schema_prompt_has_no_example_tables_to_copy(tmp_path: Path) -> None:
    # captured: `CREATE TABLE orders (...)` and `CREATE TABLE messages (...)` for a user-accounts
    # API, copied from "(users, orders, messages, ...)" in the schema stage's task
    asked, _ = await _petstore_run(tmp_path)
    docs_text = (CORPUS / "openapi_petstore_users" / "docs" / "openapi.json").read_text().lower()
    schema = strip_fences(load_recordings(PETSTORE_15B)["schema:0"])
    copied = {t for t in re.findall(r"CREATE TABLE (\w+)", schema) if t.lower() not in docs_text}
    assert copied == {"orders", "messages"}
    prompt = asked.prompts["schema:0"].lower()
    assert [t for t in sorted(copied) if re.search(rf"\b{t}\b", prompt)] == []


REDIS_15B = ENVSYNTH_FIXTURES / "captured_redis_1.5b"


async def test_every_prompt_ends_with_the_answer_it_wants_and_a_repair_names_its_file(tmp_path: Path) -> None:
    # captured on Redis: tables SET, GET, DELETE, LIST (one per tool, SQL keywords); told to
    # "answer with the complete corrected file", the schema stage answered with tools.py, 3 rounds
    docs = load_doc_set(CORPUS, CORPUS / "md_redis" / "docs")
    asked = Asked(REDIS_15B)
    report = await synthesize_env(docs, tmp_path / "redis", asked, SynthSettings(name="redis", max_rounds=1))
    static = report.rounds[0].gates[0]
    assert static.blame == ["schema"] and 'near "SET": syntax error' in static.problems[0]
    assert "makes a table per tool (SET, GET, DELETE, LIST)" in static.problems[1]
    # the schema is gated and repaired before any stage is written against its tables
    assert len(report.rounds[0].gates) == 1 and report.rounds[0].repaired == ["schema"]
    assert list(asked.prompts).index("schema:1") < list(asked.prompts).index("tools:0")
    for stage in ("schema", "tools", "seed", "policy", "policy_rules"):
        assert asked.prompts[f"{stage}:0"].splitlines()[-1].startswith("Answer with "), stage
    schema_repair = asked.prompts["schema:1"]
    assert schema_repair.splitlines()[-1].endswith(
        "the complete corrected schema.sql (SQLite CREATE TABLE statements, no Python) in one ```sql block."
    )
    assert "What to change: A table named like an SQL keyword or a tool" in schema_repair
    assert "never one table per tool" in asked.prompts["schema:0"]
    # the Python answer it gave gets told what schema.sql is
    python_answer = report.rounds[1].gates[0].problems[0]
    assert 'near "from"' in python_answer
    assert any("schema.sql is SQL" in h for h in repair_hints([python_answer]))


def test_a_db_call_left_unawaited_is_awaited() -> None:
    # captured on Redis: `db.execute("INSERT ...")` and `result = db.fetch_one(...)` without
    # await: the insert never ran and `result` was a coroutine, never None
    answer = strip_fences(load_recordings(ENVSYNTH_FIXTURES / "captured_redis_1.5b_schema_first")["tools:0"])
    unawaited = re.findall(r"(?<!await )\bdb\.(?:execute|fetch_one|fetch_all)\(", answer)
    assert len(unawaited) == 5
    fixed = with_awaited_db_calls(answer)
    assert re.findall(r"(?<!await )\bdb\.(?:execute|fetch_one|fetch_all)\(", fixed) == []
    assert fixed.count("await db.") == answer.count("await db.") + 5
    assert check_python(fixed) == check_python(answer) == []
    # a sync helper or a name other than the tool's db is left as written
    other = "def f(db):\n    db.execute('x')\n\n\nasync def g(conn):\n    conn.execute('x')\n"
    assert with_awaited_db_calls(other) == other


async def test_a_schema_repair_asks_again_for_what_was_written_against_it(tmp_path: Path) -> None:
    # captured on Redis: the schema repaired to SETS, GETS, ... but tools.py and the seed, written
    # against SET and GET, were never asked again: "unknown table 'SET'" at load, three rounds
    captured = ENVSYNTH_FIXTURES / "captured_redis_1.5b_schema_first"
    docs = load_doc_set(CORPUS, CORPUS / "md_redis" / "docs")
    asked = Asked(captured)
    await synthesize_env(docs, tmp_path / "redis", asked, SynthSettings(name="redis", max_rounds=1))
    order = list(asked.prompts)
    assert order[:2] == ["schema:0", "schema:1"]  # the schema settled first
    # tools.py and the seed are written against the repaired schema, not the first one
    tools_prompt = asked.prompts["tools:0"]
    assert "CREATE TABLE SETS" in tools_prompt and "CREATE TABLE SET (" not in tools_prompt
    assert "CREATE TABLE SETS" in asked.prompts["seed:0"]


async def test_a_policy_that_repeats_the_prompt_is_sent_back(tmp_path: Path) -> None:
    # captured on Redis (two runs): policy.md was the prompt's "## Tool documents (JSON)" and
    # "## schema.sql" sections, no rule in it; no gate read it as anything but a policy
    captured = ENVSYNTH_FIXTURES / "captured_redis_1.5b_schema_first"
    assert strip_fences(load_recordings(captured)["policy:0"]).startswith("## Tool documents (JSON)")
    docs = load_doc_set(CORPUS, CORPUS / "md_redis" / "docs")
    replay = ReplayResponder.from_path(captured)
    report = await synthesize_env(docs, tmp_path / "redis", replay, SynthSettings(name="redis", max_rounds=0))
    static = report.rounds[-1].gates[0]
    assert "policy" in static.blame
    echo = "policy.md repeats the prompt's sections (## Tool documents (JSON)"
    assert any(p.startswith(echo) for p in static.problems)


SEED_RUN = ENVSYNTH_FIXTURES / "captured_petstore_1.5b_seed_skeleton"


async def test_dates_and_the_random_module_in_a_generator_make_the_same_rows() -> None:
    # captured: the skeleton filled right but for `datetime.datetime.now() + ...` (a datetime,
    # no JSON value) with no import, and `random.randint(1, 3)` beside the seeded rng
    answer = strip_fences(load_recordings(SEED_RUN)["seed:0"])
    assert "random.randint(1, 3)" in answer and "datetime.datetime.now()" in answer
    source = "import datetime\n" + answer  # the import the skeleton now starts with
    first, again = await run_seed_generator(source), await run_seed_generator(source)
    assert len(first["users"]) + len(first["sessions"]) == 100
    assert isinstance(first["sessions"][0]["expiresAt"], str)  # ISO text, as SQLite keeps dates
    assert [r["userStatus"] for r in first["users"]] == [r["userStatus"] for r in again["users"]]
    schema = strip_fences(load_recordings(SEED_RUN)["schema:0"])
    skeleton = seed_skeleton(schema, 100)
    assert skeleton is not None and skeleton.startswith("import datetime\n")
    assert "expiresAt TIMESTAMP DEFAULT CURRENT_TIMESTAMP (an ISO date string)" in skeleton


async def test_a_failing_generator_line_is_quoted_in_the_evidence(tmp_path: Path) -> None:
    # told only 'line 24, in generate | AttributeError: ...', the model answered with the same
    # generator three rounds running
    docs = load_doc_set(CORPUS, CORPUS / "openapi_petstore_users" / "docs")
    # (its policy.md repeated the prompt and its tools kept the skeleton's placeholder, both sent
    # back by the static gate now: here a policy of rules, and the placeholders made returns)
    captured_tools = load_recordings(SEED_RUN)["tools:0"]
    tools = re.sub(r'raise ToolError\("\w+: write this body"\)', "return None", captured_tools)
    policy = "# Policy\n\n- Confirm each change with the user.\n"
    asked = Asked(SEED_RUN, overrides={"policy:0": policy, "tools:0": tools})
    report = await synthesize_env(docs, tmp_path / "p", asked, SynthSettings(name="p", max_rounds=1))
    load = report.rounds[0].gates[1]
    assert load.name == "load" and load.blame == ["seed"]
    assert "(line 24: 'expiresAt': datetime.datetime.now() + datetime.timedelta(days=1)," in load.problems[0]
    assert "(line 24: 'expiresAt': datetime.datetime.now()" in asked.prompts["seed:1"]


def test_a_tool_left_as_the_skeleton_placeholder_is_named() -> None:
    # captured on Petstore: the model wrote a check above the placeholder and kept
    # `raise ToolError("createUser: write this body")` as its refusal, in five of seven tools
    answer = strip_fences(load_recordings(SEED_RUN)["tools:0"])
    assert left_placeholders(answer) == ["createUser", "loginUser", "updateUser", "deleteUser"]
    docs = load_doc_set(CORPUS, CORPUS / "openapi_petstore_users" / "docs")
    skeleton = tools_skeleton(docs)
    assert "raise NotImplementedError" in skeleton and "write this body" not in skeleton
    assert left_placeholders(skeleton) == [d.name for d in docs]


def test_the_rules_format_copied_as_it_is_declares_no_rule() -> None:
    # captured on Petstore and Redis: policy_rules.toml was the format's example, get_x, x_id and
    # delete_x included, tools this env does not have; the example is now commented out
    import textwrap
    import tomllib

    from envforge.synth.envsynth import RULES_FORMAT

    copied = strip_fences(load_recordings(SEED_RUN)["policy_rules:0"])
    assert 'param = "x_id"' in copied and 'tool = "delete_x"' in copied
    example = textwrap.dedent("\n".join(ln for ln in RULES_FORMAT.splitlines() if ln.startswith("    ")))
    assert "get_x" in example and tomllib.loads(example) == {}


async def test_mysql_clauses_sqlite_cannot_read_are_cut_from_the_schema(tmp_path: Path) -> None:
    # captured on Slack: `updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP`
    # answered to 'near "ON": syntax error' unchanged in all three repair rounds
    captured = ENVSYNTH_FIXTURES / "captured_slack_1.5b"
    answer = strip_fences(load_recordings(captured)["schema:0"])
    assert "ON UPDATE CURRENT_TIMESTAMP" in answer
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    asked = Asked(captured)
    report = await synthesize_env(docs, tmp_path / "slack", asked, SynthSettings(name="slack", max_rounds=0))
    static = report.rounds[0].gates[0]
    assert not any("syntax error" in p for p in static.problems), static.problems
    kept = (rejected_dir(tmp_path / "slack") / "rejected_candidate" / "schema.sql.txt").read_text()
    assert "ON UPDATE" not in kept
    assert kept.count("DEFAULT CURRENT_TIMESTAMP") == answer.count("DEFAULT CURRENT_TIMESTAMP")
    # the schema parsing, the seed stage gets its skeleton (the capture's seed imported sqlite3)
    seed_prompt = asked.prompts["seed:0"]
    assert "## Seed skeleton" in seed_prompt and "slack_channels_rows = []" in seed_prompt


async def test_a_reference_to_a_column_that_is_no_key_is_cut_before_load(tmp_path: Path) -> None:
    # captured on Slack: `FOREIGN KEY (thread_ts) REFERENCES slack_messages(timestamp)`; SQLite
    # takes the schema, then refuses every row of the child table ("foreign key mismatch") at load,
    # and the model kept it through three repairs that named it
    captured = ENVSYNTH_FIXTURES / "captured_slack_1.5b"
    answer = strip_fences(load_recordings(captured)["schema:0"])
    named = "slack_thread_replies.thread_ts references slack_messages.timestamp, which is not a key"
    assert any(named in p for p in reference_problems(answer.replace(" ON UPDATE CURRENT_TIMESTAMP", "")))
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    asked = Asked(captured)
    report = await synthesize_env(docs, tmp_path / "slack", asked, SynthSettings(name="slack", max_rounds=1))
    assert not any(p.startswith("schema.sql") for r in report.rounds for g in r.gates for p in g.problems)
    kept = (rejected_dir(tmp_path / "slack") / "rejected_candidate" / "schema.sql.txt").read_text()
    assert "REFERENCES slack_messages(timestamp)" not in kept
    assert "FOREIGN KEY (parent_message_id) REFERENCES slack_messages(id)" in kept  # a key: kept
    assert reference_problems(kept) == []


async def test_the_policy_stage_is_shown_a_line_per_tool_not_the_files(tmp_path: Path) -> None:
    # captured on Redis, Petstore and Slack: policy.md was the prompt's "## Tool documents (JSON)"
    # and "## schema.sql" sections copied; the policy stages now see a line per tool instead
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    asked = Asked(ENVSYNTH_FIXTURES / "captured_slack_1.5b")
    await synthesize_env(docs, tmp_path / "slack", asked, SynthSettings(name="slack", max_rounds=0))
    for stage in ("policy:0", "policy_rules:0"):
        prompt = asked.prompts[stage].split("## policy.md")[0]  # (the captured policy.md is an echo)
        assert "## Tool documents (JSON)" not in prompt and "## tools.py" not in prompt, stage
        assert "\n- slack_post_message(channel_id, text): Post a new message to a Slack channel [" in prompt
    assert "## schema.sql" not in asked.prompts["policy:0"]
    assert "## Tool documents (JSON)" not in asked.prompts["seed:0"]  # it has its skeleton


async def test_the_probes_evidence_on_the_captured_tools_says_what_to_change(tmp_path: Path) -> None:
    # the 1.5B's Slack tools.py against a seed the skeleton makes: an unknown channel answered []
    # or null, a write returning db.execute's cursor, a body naming `text` it never set
    captured = ENVSYNTH_FIXTURES / "captured_slack_1.5b"
    schema = strip_fences(load_recordings(captured)["schema:0"]).replace(" ON UPDATE CURRENT_TIMESTAMP", "")
    schema = schema.replace(",\n    FOREIGN KEY (thread_ts) REFERENCES slack_messages(timestamp)", "")
    skeleton = seed_skeleton(schema, 100)
    assert skeleton is not None
    policy = "# Policy\n\n- Confirm each change with the user.\n"
    asked = Asked(captured, overrides={"seed:0": f"```python\n{_filled(skeleton)}```", "policy:0": policy})
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    report = await synthesize_env(docs, tmp_path / "slack", asked, SynthSettings(name="slack", max_rounds=1))
    probes = report.rounds[0].gates[-1]
    assert probes.name == "probes" and report.rounds[0].repaired == ["tools"]
    repair = "\n".join(v for k, v in asked.prompts.items() if k.startswith("tool_"))  # one per tool
    for hint in ("Look each id up before using it", "db.execute returns a cursor", "The tool crashed"):
        assert f"What to change: {hint}" in repair, hint


async def test_a_crashing_tool_s_error_reaches_the_repair(tmp_path: Path) -> None:
    # captured on Slack (static and load passed): two tools crashed, and the evidence said only
    # "internal error of the environment ... (ConfinedToolCrash; a bug in the env, not a refusal)",
    # which is all an agent may see; the model repairing the tool needs the error itself
    captured = ENVSYNTH_FIXTURES / "captured_slack_1.5b_probes"
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    asked = Asked(captured)
    report = await synthesize_env(docs, tmp_path / "slack", asked, SynthSettings(name="slack", max_rounds=1))
    probes = report.rounds[0].gates[-1]
    assert [g.name for g in report.rounds[0].gates] == ["static", "load", "probes"]
    crashed = [p for p in probes.problems if "no valid call" in p]
    assert crashed and all("[it crashed: ConfinedToolCrash: " in p for p in crashed), crashed
    assert "[it crashed: ConfinedToolCrash: " in asked.prompts["tool_slack_add_reaction:1"]


async def test_rules_that_are_the_format_s_example_are_dropped(tmp_path: Path) -> None:
    # captured on Slack: the commented-out example uncommented, `tools = ["get_x"]`,
    # `param = "x_id"`, `tool = "delete_x"`; the sections it wrote of its own are kept
    captured = ENVSYNTH_FIXTURES / "captured_slack_1.5b_probes"
    answer = strip_fences(load_recordings(captured)["policy_rules:0"])
    assert 'tools = ["get_x"]' in answer and "[confirmation]" in answer
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    await synthesize_env(docs, tmp_path / "slack", Asked(captured), SynthSettings(name="slack", max_rounds=0))
    kept = (rejected_dir(tmp_path / "slack") / "rejected_candidate" / "policy_rules.toml.txt").read_text()
    assert not any(name in kept for name in ("get_x", "x_id", "delete_x")), kept
    assert "[confirmation]\nrequired = true" in kept and "[transfer]" in kept


async def test_a_key_named_after_another_table_is_drawn_from_its_rows() -> None:
    # the 1.5B's Slack schema (captured): `slack_user_profiles` keyed by a `user_id` with no
    # REFERENCES; the seed gave each profile an id of its own (`slack_user_profile_1`), so no user
    # had a profile and its tester's lookup of a real user's profile was refused
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    answer = load_recordings(ENVSYNTH_FIXTURES / "captured_slack_1.5b_lookup")["schema:0"]
    schema = schema_as_kept(answer, docs)
    assert "REFERENCES slack_users" not in schema
    skeleton = seed_skeleton(schema, 100)
    assert skeleton is not None
    assert "'user_id': slack_users_rows[(i - 1) % len(slack_users_rows)]['id']" in skeleton
    assert skeleton.index("slack_users_rows = []") < skeleton.index("slack_user_profiles_rows = []")
    rows = await run_seed_generator(_filled(skeleton))
    users = [r["id"] for r in rows["slack_users"]]
    profiles = [r["user_id"] for r in rows["slack_user_profiles"]]
    assert sorted(profiles) == sorted(users)  # one profile per user, each key unique


def test_a_name_that_points_at_two_tables_or_none_implies_no_reference() -> None:
    schema = (
        "CREATE TABLE owners (id TEXT PRIMARY KEY);\nCREATE TABLE pet_owners (id TEXT PRIMARY KEY);\n"
        "CREATE TABLE pets (id TEXT PRIMARY KEY, owner_id TEXT, vet_id TEXT);\n"
    )
    skeleton = seed_skeleton(schema, 30)
    assert skeleton is not None
    assert "'owner_id': ...," in skeleton and "'vet_id': ...," in skeleton


def test_text_ids_are_written_as_short_codes_not_code_words() -> None:
    # left to it, the 1.5B wrote `slack_message_14`, which task instructions then said raw: a
    # code word in 7 of 50 tasks of its Slack env; a natural key (a username) stays the model's
    schema = (
        "CREATE TABLE slack_channels (id TEXT PRIMARY KEY, name TEXT NOT NULL);\n"
        "CREATE TABLE slack_thread_replies (id TEXT PRIMARY KEY,"
        " channel_id TEXT NOT NULL REFERENCES slack_channels(id), text TEXT);\n"
        "CREATE TABLE slack_channel_settings (channel_id TEXT PRIMARY KEY REFERENCES slack_channels(id),"
        " topic TEXT);\n"
        "CREATE TABLE slack_logins (username TEXT PRIMARY KEY, seen TEXT);\n"
    )
    skeleton = seed_skeleton(schema, 40) or ""
    assert "'id': f\"C-{i}\"" in skeleton and "'id': f\"TR-{i}\"" in skeleton
    assert "'channel_id': slack_channels_rows[(i - 1) % len(slack_channels_rows)]['id']" in skeleton
    assert "'username': ...," in skeleton
    assert check_python(skeleton.replace("...", "'x'"), imports=SEED_IMPORTS) == []
    namespace: dict[str, Any] = {}
    exec(skeleton.replace("...", "'x'"), namespace)  # the skeleton alone, filled with a constant
    ids = [row["id"] for row in namespace["generate"]()["slack_thread_replies"]]
    assert ids[:2] == ["TR-1", "TR-2"] and not any(re.search(r"[a-z]_[a-z0-9]", i) for i in ids)
