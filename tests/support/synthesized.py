"""What every synthesized env kept by the project must do: serve its documented tools over MCP and
keep its shipped tasks verified."""

from __future__ import annotations

from pathlib import Path

from envforge.server import Environment, Fleet
from envforge.synth import SynthContext, build_graph, load_tasks, verify_task
from envforge.synth.envsynth import ToolDoc, introspect_mcp, schema_problems


async def assert_serves_docs_and_tasks_verify(
    env: Environment, root: Path, docs: list[ToolDoc], min_tasks: int
) -> None:
    """`env` (loaded from `root`) serves exactly `docs` over MCP, in process, and each of its at
    least `min_tasks` tasks verifies."""
    fleet = Fleet([env])
    try:
        served = await introspect_mcp(fleet.mcp(env.name).server)  # over MCP, in process
        assert {t.name for t in served} == {d.name for d in docs}
        assert all(schema_problems(d, env) == [] for d in docs)
        tasks = load_tasks(root)
        assert len(tasks) >= min_tasks
        ctx = SynthContext.create(env, await build_graph(env, fleet), fleet)
        for task in tasks:
            assert await verify_task(ctx, task) == [], task.id
    finally:
        await fleet.aclose()
