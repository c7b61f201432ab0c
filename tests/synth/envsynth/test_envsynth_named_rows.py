"""A write given a value that names a row must act on that row: refuse a value naming none (with a
refusal, not a crash), never copy the name into a row as data, and write something when the row
exists.

Captured: Qwen2.5-Coder-1.5B's `slack_add_reaction(channel_id, timestamp, reaction)`, bundled in
`envs/slack` as it passed every gate, never looked the message up. It inserted a new message
holding the timestamp as its text, whatever the timestamp named, and the id probe skipped it: a
message's `timestamp` is neither a primary nor a foreign key, yet every seed message has its own.
Its repairs under the first probe for this are each a way around a check, kept here as attacks:
look the timestamp up and insert all the same; then check only the channel, parse the timestamp
(which crashes on one naming nothing, read as a refusal) and update no row.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from envforge.server import load_env
from envforge.synth.envsynth import (
    SynthSettings,
    function_source,
    load_docs,
    probe_env,
    splice_tool,
    synthesize_env,
    table_facts,
)

from support.envsynth_asked import Asked
from support.paths import ENVSYNTH_FIXTURES, REPO

SLACK = REPO / "envs" / "slack"
ACCEPTED = ENVSYNTH_FIXTURES / "accepted_slack_1.5b"

HEADER = '''@tool(writes=["slack_messages"])
async def slack_add_reaction(db: Db, channel_id: str, timestamp: str, reaction: str) -> Any:
    """Add a reaction emoji to a message

    Args:
        channel_id: The ID of the channel containing the message
        timestamp: The timestamp of the message to react to
        reaction: The name of the emoji reaction (without ::)
    """
'''
"""The function's decorator, signature and docstring, as in every answer below."""

AS_WRITTEN = (
    HEADER
    + """    # Get count of existing messages in the table
    count = await db.fetch_one("SELECT COUNT(*) AS n FROM slack_messages")

    # Generate a new ID based on the count of existing rows
    new_id = f"slack_message_{count['n'] + 1}"

    # Insert the row with the generated ID and other details
    result = await db.execute(
        "INSERT INTO slack_messages (id, channel_id, text, reaction_emojis) VALUES (?, ?, ?, ?)",
        (new_id, channel_id, timestamp, reaction)
    )

    # Return the row read back from the database
    return await db.fetch_one("SELECT * FROM slack_messages WHERE id = ?", (new_id,))
"""
)
"""The model's function as the pipeline kept it (the bundled env's before this probe)."""

LOOKS_UP_THEN_INSERTS = AS_WRITTEN.replace(
    "    # Get count",
    '    await db.require_one("SELECT timestamp FROM slack_messages WHERE timestamp = ?", (timestamp,),'
    ' "timestamp not found")\n    # Get count',
)
"""Its first repair, told that an unknown timestamp was let through."""

WRITES_NOTHING = (
    HEADER
    + """    # Convert timestamp string to datetime object
    timestamp_obj = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%S")

    row = await db.require_one("SELECT id FROM slack_channels WHERE id = ?", (channel_id,), "no channel")

    # Change the reaction_emojis field with the new emoji
    result = await db.execute(
        "UPDATE slack_messages SET reaction_emojis = ? WHERE id = ?", (reaction, row["id"])
    )

    # Return the updated row read back from the database
    return await db.fetch_one("SELECT * FROM slack_messages WHERE id = ?", (row["id"],))
"""
)
"""Its repair told to act on the row, accepted by the probes before the two checks it games."""

LOOKS_IT_UP = (
    HEADER
    + """    row = await db.require_one(
        "SELECT id FROM slack_messages WHERE channel_id = ? AND timestamp = ?",
        (channel_id, timestamp),
        "message not found",
    )
    await db.execute("UPDATE slack_messages SET reaction_emojis = ? WHERE id = ?", (reaction, row["id"]))
    return await db.fetch_one("SELECT * FROM slack_messages WHERE id = ?", (row["id"],))
"""
)


def _slack_with(tmp_path: Path, function: str) -> Path:
    root = tmp_path / "slack"
    shutil.copytree(SLACK, root)
    spliced, refused = splice_tool((root / "tools.py").read_text(), "slack_add_reaction", function)
    assert refused is None, refused
    if "datetime." in function:  # the import the pipeline joins to tools.py for it
        tool_import = "from envforge.server import Db, ToolError, tool\n"
        spliced = spliced.replace(tool_import, tool_import + "import datetime\n", 1)
    (root / "tools.py").write_text(spliced)
    return root


async def _problems(root: Path) -> list[str]:
    problems = (await probe_env(load_env(root), load_docs(root / "docs"))).problems
    assert all(p.startswith("slack_add_reaction: ") for p in problems), problems
    return [p.removeprefix("slack_add_reaction: ") for p in problems]


async def test_a_write_that_never_looks_up_the_row_a_timestamp_names_fails_the_probes(tmp_path: Path) -> None:
    problems = await _problems(_slack_with(tmp_path, AS_WRITTEN))
    assert len(problems) == 2, problems
    copied, unknown = problems
    assert "names a row by slack_messages.timestamp, yet was written as slack_messages.text" in copied
    assert unknown.startswith("unknown timestamp='UNKNOWN-ID-0000' (it names a row by slack_messages.")
    assert "was not refused" in unknown
    # the repair is told the lookup of the row, by the column the value names it by
    assert table_facts(["slack_add_reaction: " + unknown], [], "") == [
        "Find the row the timestamp names first, before any other read or write: `row = await"
        ' db.require_one("SELECT * FROM slack_messages WHERE timestamp = ?", (timestamp,), "timestamp'
        ' not found")`, then act on that row.'
    ]


async def test_looking_the_row_up_and_inserting_all_the_same_still_fails(tmp_path: Path) -> None:
    problems = await _problems(_slack_with(tmp_path, LOOKS_UP_THEN_INSERTS))
    assert len(problems) == 1 and "yet was written as slack_messages.text" in problems[0], problems


async def test_a_crash_is_no_refusal_and_a_write_that_writes_nothing_fails(tmp_path: Path) -> None:
    problems = await _problems(_slack_with(tmp_path, WRITES_NOTHING))
    assert len(problems) == 2, problems
    idle, crashed = problems
    assert idle.startswith("every call from seed data that succeeded changed no row"), idle
    assert "crashed instead of being refused" in crashed and "does not match format" in crashed


async def test_the_same_tool_looking_the_message_up_passes_and_content_is_not_a_reference(
    tmp_path: Path,
) -> None:
    # a value stored as given (a new message's text, a reply's thread_ts) is content, not a
    # reference: posting any text must stay allowed
    assert await _problems(_slack_with(tmp_path, LOOKS_IT_UP)) == []


async def test_a_tool_told_to_act_on_a_named_row_is_not_told_to_insert_one(tmp_path: Path) -> None:
    # captured: repeated beside "act on the row it names", its earlier rounds' lessons (the new
    # row's key, its INSERT, the order "make the new row's key, insert") won four rounds running;
    # without them the bundled env's answers reached the UPDATE
    asked = Asked(ACCEPTED)
    await synthesize_env(
        load_docs(SLACK / "docs"), tmp_path / "slack", asked, SynthSettings(name="slack", max_rounds=3)
    )
    # round 1 found the name written as data (key :2), round 2 found it still there (key :3)
    first, second = (
        asked.prompts[f"tool_slack_add_reaction:{k}"].split("## The checks slack_add_reaction fails")[1]
        for k in (2, 3)
    )
    for prompt in (first, second):
        assert "yet was written as slack_messages.text" in prompt
        assert "INSERT INTO slack_messages" not in prompt and "new_id" not in prompt
        assert "change that row with an UPDATE" in prompt and "make the new row's key" not in prompt
    assert 'row = await db.require_one("SELECT * FROM slack_messages WHERE timestamp = ?"' in first
    # the bundled env is what these answers build (test_envsynth_real_model_env.py)
    final = function_source((SLACK / "tools.py").read_text(), "slack_add_reaction") or ""
    assert "UPDATE slack_messages SET reaction_emojis" in final and "INSERT" not in final
