"""A newcomer's mistakes, each made through the real `envforge` entry point: every one must end in
a single `error:` line naming the problem, a non-zero exit, no traceback, and before any slow work
(no model load, no trial run, no call to a hosted model).

Most cases call `envforge.cli.main.main` in-process with a real argv (the console script's own
function), so the suite stays fast; the ones whose point is what happens in a fresh process
(torch never imported, `--debug`) run `python -m envforge.cli` as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from envforge.cli.main import main

from support.paths import REPO
from support.serving import envforge_serve

ENVS = REPO / "envs"
KEY_VARIABLES = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")


@pytest.fixture(autouse=True)
def no_api_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """A newcomer's shell: no provider keys set."""
    for name in KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def envforge(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """Run `envforge ARGS` through the console script's `main`: (exit code, stdout, stderr).

    Any exception escaping `main` fails the test: that is the traceback a user would have seen."""
    monkeypatch.setattr(sys, "argv", ["envforge", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, *needles: str) -> str:
    """The run failed with exactly one non-empty stderr line, an `error:` naming every needle."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0, err
    assert "Traceback" not in err
    assert len(lines) == 1, f"expected one error line, got {len(lines)}:\n{err}"
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A folder that passes for a Hugging Face model until its weights are loaded: the checks under
    test must fire before that."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


@pytest.fixture(scope="module")
def gym_server() -> Iterator[str]:
    """A real `envforge serve` that serves gym and nothing else."""
    with envforge_serve([str(ENVS / "gym")]) as url:
        yield url


# ------------------------------------------------------------------------------------------ eval


def test_eval_on_a_folder_that_does_not_exist(capsys, monkeypatch, tmp_path) -> None:
    code, _, err = envforge(
        ["eval", str(ENVS / "gymm"), "--agent", "oracle", "--out", str(tmp_path)], capsys, monkeypatch
    )
    assert_one_line_error(code, err, "gymm", "not a directory")


def test_eval_with_a_misspelt_agent(capsys, monkeypatch, tmp_path) -> None:
    code, _, err = envforge(
        ["eval", str(ENVS / "gym"), "--agent", "oracl", "--out", str(tmp_path)], capsys, monkeypatch
    )
    assert_one_line_error(code, err, "unknown agent 'oracl'", "did you mean 'oracle'")
    assert not (tmp_path / "trials.jsonl").exists()


def test_eval_with_unknown_task_ids(capsys, monkeypatch, tmp_path) -> None:
    args = ["eval", str(ENVS / "gym"), "--agent", "oracle", "--tasks", "nope", "--out", str(tmp_path / "run")]
    code, _, err = envforge(args, capsys, monkeypatch)
    assert_one_line_error(code, err, "nope")


def test_eval_with_a_hosted_model_and_no_api_key(capsys, monkeypatch, tmp_path) -> None:
    """The command the demo prints, in a shell without a key: refused before any trial runs."""
    args = ["eval", str(ENVS / "gym"), "--agent", "openai/gpt-4o-mini", "--out", str(tmp_path / "run")]
    code, _, err = envforge(args, capsys, monkeypatch)
    assert_one_line_error(code, err, "--agent openai/gpt-4o-mini", "OPENAI_API_KEY")
    assert not (tmp_path / "run" / "trials.jsonl").exists()


def test_eval_with_a_hosted_user_and_no_api_key(capsys, monkeypatch, tmp_path) -> None:
    args = ["eval", str(ENVS / "gym"), "--agent", "oracle", "--user", "anthropic/claude-3-5-haiku-latest"]
    code, _, err = envforge([*args, "--out", str(tmp_path / "run")], capsys, monkeypatch)
    assert_one_line_error(code, err, "--user", "ANTHROPIC_API_KEY")


def test_eval_against_a_server_lacking_the_env(capsys, monkeypatch, tmp_path, gym_server) -> None:
    args = ["eval", str(ENVS / "library"), "--agent", "oracle", "--server", gym_server]
    code, _, err = envforge([*args, "--out", str(tmp_path / "run")], capsys, monkeypatch)
    assert_one_line_error(code, err, "does not serve library", "it serves: gym")
    assert not (tmp_path / "run" / "trials.jsonl").exists()


def test_eval_against_no_server_at_all(capsys, monkeypatch, tmp_path) -> None:
    from support.serving import free_port

    url = f"http://127.0.0.1:{free_port()}"
    args = ["eval", str(ENVS / "gym"), "--agent", "oracle", "--server", url, "--out", str(tmp_path / "run")]
    code, _, err = envforge(args, capsys, monkeypatch)
    assert_one_line_error(code, err, "cannot reach", "envforge serve")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--answers", "loose"], ["--answers must be task or strict, not 'loose'"]),
        (["--llm-transport", "grpc"], ["--llm-transport must be auto, http or litellm, not 'grpc'"]),
        (["--local-servers", "one"], ["--local-servers must be per-role or shared, not 'one'"]),
        (["--limit", "0"], ["--limit must be at least 1, not 0"]),
        (["--split", " "], ["--split must name a split"]),
        (
            [
                *("--agent", "openai/gpt-4o", "--agent-api-base", "http://127.0.0.1:9"),
                *("--user", "anthropic/claude-3-5-haiku-latest", "--user-api-base", "http://127.0.0.1:9"),
                *("--llm-transport", "http"),
            ],
            ["transport 'http' needs openai/ or hosted_vllm/", "anthropic/claude-3-5-haiku-latest"],
        ),
    ],
)
def test_eval_with_an_option_out_of_its_choices(capsys, monkeypatch, tmp_path, args, needles) -> None:
    """Each eval option that only takes some values names them, and nothing runs."""
    base = ["eval", str(ENVS / "gym"), "--agent", "oracle", "--out", str(tmp_path / "run")]
    code, _, err = envforge([*base, *args], capsys, monkeypatch)
    assert code == 2
    assert_one_line_error(code, err, *needles)
    assert not (tmp_path / "run" / "trials.jsonl").exists()


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--sqlite-work-mib", "0"], ["--sqlite-work-mib (ENVFORGE_SQLITE_WORK_MIB) must be >= 1"]),
        (
            ["--max-episodes", "0"],
            ["--max-episodes, --max-episodes-per-client,", "--max-body-bytes must be >= 1"],
        ),
        (
            ["--max-connections-per-client", "0"],
            ["--max-connections-per-client and --max-body-bytes must be >= 1"],
        ),
        (["--body-deadline", "0"], ["--header-timeout, --body-timeout and --body-deadline must be positive"]),
        (["--host", "0.0.0.0", "--port", "0"], ["token"]),
    ],
)
def test_serve_with_a_limit_out_of_its_range(capsys, monkeypatch, args, needles) -> None:
    """A cap of 0 would refuse every client, a timeout of 0 every request: refused before serving."""
    monkeypatch.delenv("ENVFORGE_TOKEN", raising=False)
    code, out, err = envforge(["serve", str(ENVS / "gym"), *args], capsys, monkeypatch)
    assert code == 2
    assert_one_line_error(code, err, *needles)
    assert "serving" not in out + err


# ----------------------------------------------------------------------------------- train/collect


def test_train_with_a_model_folder_that_does_not_exist_never_imports_torch(tmp_path) -> None:
    """A fresh process: the mistake is reported before torch (seconds, and a 300-line trace) loads."""
    probe = (
        "import sys\n"
        "from envforge.cli.main import main\n"
        f"sys.argv = ['envforge', 'train', '--model', '/nonexistent', '--envs', {str(ENVS / 'gym')!r}, "
        f"'--out', {str(tmp_path)!r}]\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded', code)\n"
    )
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split() == ["torch", "not", "loaded", "2"], done.stdout + done.stderr
    assert_one_line_error(2, done.stderr, "--model /nonexistent", "config.json")


def test_train_tasks_per_step_is_checked_before_the_model_loads(
    capsys, monkeypatch, tmp_path, model_dir
) -> None:
    args = ["train", "--model", str(model_dir), "--envs", str(ENVS / "gym"), "--tasks-per-step", "1"]
    code, _, err = envforge([*args, "--out", str(tmp_path / "out")], capsys, monkeypatch)
    assert_one_line_error(code, err, "--tasks-per-step 1", ">= 2")


def test_train_takes_several_envs_after_one_flag_as_the_readme_writes(
    capsys, monkeypatch, tmp_path, model_dir
) -> None:
    """`--envs envs/a envs/b` (README): both envs count (the ERPO minimum becomes 4), no "extra argument"."""
    args = ["train", "--model", str(model_dir), "--envs", str(ENVS / "gym"), str(ENVS / "library")]
    code, _, err = envforge(
        [*args, "--tasks-per-step", "2", "--out", str(tmp_path / "out")], capsys, monkeypatch
    )
    assert_one_line_error(code, err, ">= 4 for 2 env(s)")


def test_train_with_a_hosted_user_and_no_api_key(capsys, monkeypatch, tmp_path, model_dir) -> None:
    args = ["train", "--model", str(model_dir), "--envs", str(ENVS / "gym"), "--user", "openai/gpt-4o"]
    code, _, err = envforge([*args, "--out", str(tmp_path / "out")], capsys, monkeypatch)
    assert_one_line_error(code, err, "--user openai/gpt-4o", "OPENAI_API_KEY")


def test_collect_on_a_fleet_lacking_the_env(capsys, monkeypatch, tmp_path, model_dir, gym_server) -> None:
    args = ["collect", "--model", str(model_dir), "--envs", str(ENVS / "library"), "--fleet-url", gym_server]
    code, _, err = envforge([*args, "--out", str(tmp_path / "out")], capsys, monkeypatch)
    assert_one_line_error(code, err, "--fleet-url", "does not serve library", str(ENVS / "library"))


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--backend", "tgi"], ["--backend must be hf or vllm, not 'tgi'"]),
        (["--env-kind", "chat"], ["--env-kind must be harness or fleet, not 'chat'"]),
        (
            ["--tasks", "some"],
            [
                "--tasks must be all, lookup, steps, lookup+steps, told, lookup+told, pair or "
                "lookup+pair, not 'some'"
            ],
        ),
        (["--backend", "vllm"], ["--backend vllm needs --vllm-url"]),
        (["--ray-workers", "-1"], ["--ray-workers must be >= 0"]),
        (["--ray-address", "ray://h:10001"], ["--ray-address needs --ray-workers N"]),
        (
            ["--eval-every", "2"],
            ["--eval-every evaluates held-out tasks: use it with --tasks other than all"],
        ),
    ],
)
def test_train_with_options_that_cannot_run_together(
    capsys, monkeypatch, tmp_path, model_dir, args, needles
) -> None:
    """Each refused before the envs load and the model loads, with the flags the user typed."""
    base = ["train", "--model", str(model_dir), "--envs", str(ENVS / "gym"), "--out", str(tmp_path / "out")]
    code, _, err = envforge([*base, *args], capsys, monkeypatch)
    assert code == 2
    assert_one_line_error(code, err, *needles)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ synth


def test_synth_tasks_with_an_llm_and_no_api_key(capsys, monkeypatch, tmp_path) -> None:
    args = [
        "synth",
        "tasks",
        str(ENVS / "gym"),
        "--llm",
        "openai/gpt-4o-mini",
        "--out",
        str(tmp_path / "t.jsonl"),
    ]
    code, _, err = envforge(args, capsys, monkeypatch)
    assert_one_line_error(code, err, "--llm openai/gpt-4o-mini", "OPENAI_API_KEY")
    assert not (tmp_path / "t.jsonl").exists()


def test_synth_env_without_a_model(capsys, monkeypatch, tmp_path) -> None:
    args = ["synth", "env", str(ENVS / "library" / "docs"), "-o", str(tmp_path / "library")]
    code, _, err = envforge(args, capsys, monkeypatch)
    line = assert_one_line_error(code, err, "--model", "--replay")
    assert "\x1b[" not in line and "model=replay" not in err


def test_synth_env_with_a_bad_env_name_keeps_the_pattern(capsys, monkeypatch, tmp_path) -> None:
    args = [
        "synth",
        "env",
        str(ENVS / "library" / "docs"),
        "-o",
        str(tmp_path / "Bad-Name"),
        "--model",
        "openai/x",
    ]
    code, _, err = envforge(args, capsys, monkeypatch)
    assert_one_line_error(code, err, "'Bad-Name'", "[a-z][a-z0-9_]*", "--name")


# ----------------------------------------------------------------------------------------- replay


def test_replay_export_tau2_on_an_env_that_is_not_tau2(capsys, monkeypatch, tmp_path) -> None:
    actions = tmp_path / "actions.json"
    actions.write_text(json.dumps([]))
    args = ["replay", str(ENVS / "gym"), "--actions", str(actions), "--export", "tau2"]
    code, _, err = envforge(args, capsys, monkeypatch)
    assert_one_line_error(code, err, "--export tau2", "gym")


# ------------------------------------------------------------------------------------------ debug


def test_debug_shows_the_traceback_that_the_one_line_error_hides(capsys, monkeypatch, tmp_path) -> None:
    """The same mistake with `--debug`: the full traceback, for a bug report (a fresh process, as a
    user runs it)."""
    actions = tmp_path / "actions.json"
    actions.write_text("[]")
    args = ["replay", str(ENVS / "gym"), "--actions", str(actions), "--export", "tau2"]
    code, _, err = envforge(args, capsys, monkeypatch)
    assert_one_line_error(code, err, "--export tau2")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    debug = subprocess.run(
        [sys.executable, "-m", "envforge.cli", "--debug", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "KeyError" in debug.stderr


def test_synth_env_resume_is_for_a_model_and_a_readable_recording(capsys, monkeypatch, tmp_path) -> None:
    base = ["synth", "env", str(ENVS / "library" / "docs"), "-o", str(tmp_path / "library")]
    recording = tmp_path / "responses.json"
    recording.write_text('{"note": "x", "responses": {}}')
    code, _, err = envforge(
        [*base, "--replay", str(recording), "--resume", str(recording)], capsys, monkeypatch
    )
    assert_one_line_error(code, err, "--resume", "--replay")
    broken = tmp_path / "broken.json"
    broken.write_text('{"responses": ')
    code, _, err = envforge([*base, "--model", "local", "--resume", str(broken)], capsys, monkeypatch)
    assert_one_line_error(code, err, "cannot read --resume", "broken.json")
    assert not (tmp_path / "library").exists()
