"""`inspect eval envforge/<env>` resolves through envforge's entry point, and what inspect shows the
model is the env's own."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

inspect_ai = pytest.importorskip("inspect_ai", reason="inspect_ai is the `inspect` extra")

from inspect_ai.log import read_eval_log  # noqa: E402

from envforge.harness import request_text  # noqa: E402
from envforge.integrations.inspect_tasks import bundled_envs, envforge_task, tool_params  # noqa: E402
from envforge.server import load_env  # noqa: E402
from envforge.synth import load_tasks  # noqa: E402

from support.paths import REPO, bundled_env_dirs  # noqa: E402

INSPECT = Path(sys.executable).parent / "inspect"


def test_the_entry_point_names_the_module_and_every_bundled_env_is_a_task() -> None:
    (ep,) = [ep for ep in entry_points(group="inspect_ai") if ep.name == "envforge"]
    assert ep.value == "envforge.integrations.inspect_tasks"
    assert set(bundled_envs()) >= {load_env(p).name for p in bundled_env_dirs()}


@pytest.mark.skipif(not INSPECT.exists(), reason="inspect's CLI is not installed next to this Python")
def test_inspect_eval_envforge_env_runs_and_writes_a_scored_log(tmp_path: Path) -> None:
    args = ["eval", "envforge/car_rental", "-T", "limit=1", "--model", "mockllm/model", "--display", "none"]
    done = subprocess.run(
        [str(INSPECT), *args, "--log-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = tmp_path.glob("*.eval")
    log = read_eval_log(str(path))
    assert log.status == "success" and log.eval.task_registry_name == "envforge/car_rental"
    assert log.samples is not None and len(log.samples) == 1
    (score,) = (log.samples[0].scores or {}).values()
    # mockllm's default answer rents nothing: the state part fails, and the reward with it
    assert score.value == 0.0 and score.metadata is not None and score.metadata["parts"]["state"] == 0.0


def test_an_unknown_env_folder_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not an env folder"):
        envforge_task(tmp_path)
    with pytest.raises(ValueError, match="has no task 'nope'"):
        envforge_task(REPO / "envs" / "gym", task_ids=["nope"])


@pytest.mark.parametrize("env_name", ["flight_booking", "gym", "library"])
def test_samples_and_tool_schemas_are_the_envs_own(env_name: str) -> None:
    env_dir = REPO / "envs" / env_name
    env = load_env(env_dir)
    task = envforge_task(env_dir, limit=2)
    first = load_tasks(env_dir)[0]
    sample = task.dataset[0]
    assert sample.id == first.id and sample.metadata == {"env": env.name, "task_id": first.id}
    assert isinstance(sample.input, list)
    assert [m.role for m in sample.input] == ["system", "user"]
    assert sample.input[0].text == env.policy.strip() and sample.input[1].text == request_text(first)
    for tool in env.tools.values():
        shown = tool_params(tool.input_schema).model_dump(exclude_none=True)
        assert shown["additionalProperties"] is False
        assert sorted(shown["required"]) == sorted(tool.input_schema.get("required", []))
        assert set(shown["properties"]) == set(tool.input_schema["properties"])
        for name, prop in tool.input_schema["properties"].items():
            ours = shown["properties"][name]
            assert ours.get("description") == prop.get("description"), (tool.name, name)
            if "$ref" not in str(prop):
                assert ours == _shown(prop), (tool.name, name)


def _shown(node: object) -> object:
    """A JSON schema as inspect's schema model keeps it: no titles, no `default: null` (which it
    reads as no default; the parameter stays optional)."""
    if isinstance(node, dict):
        return {k: _shown(v) for k, v in node.items() if k != "title" and not (k == "default" and v is None)}
    if isinstance(node, list):
        return [_shown(v) for v in node]
    return node


def test_import_envforge_imports_no_inspect_even_where_it_is_installed() -> None:
    code = (
        "import sys, envforge, envforge.integrations\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'inspect_ai'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
