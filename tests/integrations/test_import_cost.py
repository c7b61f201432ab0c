"""Installing an integration's extra never slows `import envforge` or `make demo`: neither imports
a framework (trl, OpenEnv, verifiers, inspect_ai) nor what they bring (datasets, gradio), where
they are installed as much as where they are not.

Each check runs in a fresh interpreter and reads `sys.modules`: a framework's import takes seconds
(OpenEnv's loads gradio), and a module-level import of one anywhere on these paths would show.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from support.paths import REPO

FRAMEWORKS = ("trl", "openenv", "verifiers", "inspect_ai", "datasets", "gradio")
INSTALLED = [m for m in FRAMEWORKS if importlib.util.find_spec(m) is not None]
NONE_INSTALLED = (
    "none of trl, openenv, verifiers, inspect_ai, datasets, gradio is installed (make test installs "
    "them): with nothing to import, no import could leak"
)


def _loaded_after(code: str) -> list[str]:
    """The frameworks (top-level names) loaded once `code` has run in a fresh interpreter."""
    probe = (
        f"import sys\n{code}\n"
        f"print(','.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({FRAMEWORKS!r}))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120, check=True
    )
    return [m for m in out.stdout.strip().split(",") if m]


@pytest.mark.skipif(not INSTALLED, reason=NONE_INSTALLED)
def test_import_envforge_and_its_integrations_package_load_no_framework() -> None:
    code = (
        "import envforge, envforge.integrations\n"
        "envforge.run_episode, envforge.check_tasks, envforge.evaluate, envforge.RunOptions"
    )
    assert _loaded_after(code) == []


@pytest.mark.skipif(not INSTALLED, reason=NONE_INSTALLED)
def test_the_cli_and_the_demos_evaluation_path_load_no_framework() -> None:
    """What `make demo` (`envforge demo`) imports: the CLI's commands, the demo, the harness's
    evaluation, report and agents, the in-process fleet."""
    code = (
        "import envforge.cli.main, envforge.cli.demo\n"
        "from envforge.harness import EvalConfig, run_eval, write_report, build_agent, Limits\n"
        "from envforge.server import Fleet"
    )
    assert _loaded_after(code) == []


@pytest.mark.skipif(not INSTALLED, reason=NONE_INSTALLED)
def test_the_probe_sees_a_framework_that_is_imported() -> None:
    """The check can fail: an import of an installed framework is seen."""
    assert INSTALLED[0] in _loaded_after(f"import {INSTALLED[0]}")
