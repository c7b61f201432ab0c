"""Attacks by model-written tools.py on the host, with the static gate deliberately skipped.

Each test loads a confined env folder straight through `load_env` (as serving does), so the only
thing standing between the payload and the host is the OS confinement of the worker process.
Every payload must fail, the serving process must stay up, and other episodes must keep working.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import textwrap
import threading
from pathlib import Path

import anyio
import pytest

import envforge.server
from envforge.server import EnvLoadError, Fleet, load_env
from envforge.server.sandbox import confined_tools as confined_tools_module
from envforge.server.sandbox import confinement

from support.confined import make_confined_env

PAYLOAD_TOOLS = textwrap.dedent(
    '''
    """Payloads: each tool tries to reach the host from inside a confined worker."""

    from __future__ import annotations

    import asyncio
    import os
    import socket
    import subprocess

    from envforge.server import Db, ToolError, tool


    @tool(writes=["notes"])
    async def add_note(db: Db, body: str) -> dict:
        """Add a note.

        Args:
            body: Text of the note.
        """
        cur = await db.execute("INSERT INTO notes (body) VALUES (?)", (body,))
        return {"id": cur.lastrowid, "body": body}


    @tool
    async def count_notes(db: Db) -> int:
        """How many notes there are."""
        return await db.fetch_value("SELECT COUNT(*) FROM notes")


    @tool
    async def write_file(db: Db, path: str) -> str:
        """Write a file.

        Args:
            path: Where.
        """
        with open(path, "w") as f:
            f.write("pwned")
        return "written"


    @tool
    async def read_file(db: Db, path: str) -> str:
        """Read a file.

        Args:
            path: Which.
        """
        with open(path) as f:
            return f.read()


    @tool
    async def writable_mounts(db: Db) -> list:
        """Every mounted folder a file could be created in: (mount point, type, options)."""
        out = []
        with open("/proc/self/mounts") as f:
            for line in f:
                _dev, point, kind, options = line.split()[:4]
                writable = "rw" in options.split(",")
                if writable and kind not in ("proc", "devpts") and os.path.isdir(point):
                    out.append([point, kind, options])
        return out


    @tool
    async def connect(db: Db, port: int) -> str:
        """Open a TCP connection.

        Args:
            port: Port on 127.0.0.1.
        """
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(b"exfiltrated")
        return "connected"


    @tool
    async def environment(db: Db) -> dict:
        """The worker's environment variables."""
        return dict(os.environ)


    @tool
    async def spawn(db: Db, path: str) -> str:
        """Start a process.

        Args:
            path: A file the process would create.
        """
        subprocess.run(["/usr/bin/touch", path], check=True)
        return "spawned"


    @tool
    async def fork(db: Db) -> str:
        """Fork."""
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        return "forked"


    @tool
    async def eat_memory(db: Db) -> str:
        """Allocate 8 GiB."""
        block = bytearray(8 * 1024 * 1024 * 1024)
        return str(len(block))


    @tool
    async def spin(db: Db) -> str:
        """Burn CPU forever."""
        n = 0
        while True:
            n += 1


    @tool
    async def spin_later(db: Db, seconds: float, how: str) -> str:
        """Lift the CPU limit, then leave work behind that burns CPU after the call returned.

        Args:
            seconds: How long the left-behind work spins.
            how: "timer" (loop.call_later) or "task" (a task that yields now and then).
        """
        import resource
        import time

        lifted = "kept"
        try:
            resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            lifted = "lifted"
        except (ValueError, OSError):
            pass

        def spin() -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                pass

        async def chew() -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for _ in range(10000):
                    pass
                await asyncio.sleep(0)

        loop = asyncio.get_running_loop()
        if how == "timer":
            loop.call_later(0.2, spin)
        else:
            loop.create_task(chew())
        return lifted


    @tool
    async def cpu_used(db: Db) -> float:
        """CPU seconds this worker has used so far."""
        import resource

        used = resource.getrusage(resource.RUSAGE_SELF)
        return used.ru_utime + used.ru_stime


    @tool
    async def spin_past_the_budget(db: Db) -> str:
        """Raise the CPU limit as far as it goes, then burn CPU inside the call."""
        import resource

        _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
        n = 0
        while True:
            n += 1


    @tool(writes=["notes"])
    async def add_then_die(db: Db, body: str) -> str:
        """Write, then kill the worker.

        Args:
            body: Text of the note.
        """
        await db.execute("INSERT INTO notes (body) VALUES (?)", (body,))
        os.kill(os.getpid(), 9)
        return "unreachable"


    @tool(writes=["notes"])
    async def add_slowly(db: Db, body: str, seconds: float) -> str:
        """Write, wait, write again.

        Args:
            body: Text of the notes.
            seconds: How long to wait between the writes.
        """
        await db.execute("INSERT INTO notes (body) VALUES (?)", (body,))
        await asyncio.sleep(seconds)
        await db.execute("INSERT INTO notes (body) VALUES (?)", (body + " again",))
        return "both"
    '''
)


@pytest.fixture
def payload_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-parent-secret-123")
    limits = dataclasses.replace(
        confined_tools_module.DEFAULT_LIMITS, call_timeout_s=8.0, cpu_seconds_per_call=3
    )
    monkeypatch.setattr(confined_tools_module, "DEFAULT_LIMITS", limits)
    return load_env(make_confined_env(tmp_path / "payloads", PAYLOAD_TOOLS), static_gate=False)


async def _bystander_still_works(fleet: Fleet) -> None:
    """Another episode of the same env keeps working after an attack."""
    other = await fleet.create_episode("payloads")
    added = await fleet.call(other.id, "add_note", {"body": "bystander"})
    assert not added.is_error, added.text
    assert (await fleet.call(other.id, "count_notes", {})).text == "2"


async def test_the_serving_process_never_imports_confined_tools(payload_env, tmp_path: Path) -> None:
    import sys

    assert not [m for m in sys.modules if m.startswith("envforge_env_payloads")]
    assert set(payload_env.tools) >= {"add_note", "write_file", "spin"}


async def test_writing_outside_scratch_fails(payload_env, tmp_path: Path) -> None:
    targets = [
        tmp_path / "pwned.txt",
        Path(envforge.server.__file__).resolve().parent / "pwned.py",
        Path.home() / "envforge-pwned.txt",
    ]
    fleet = Fleet([payload_env])
    try:
        ep = await fleet.create_episode("payloads")
        for target in targets:
            result = await fleet.call(ep.id, "write_file", {"path": str(target)})
            assert result.is_error, result.text
            assert not target.exists()
        await _bystander_still_works(fleet)
    finally:
        await fleet.aclose()


async def test_the_capped_scratch_is_the_only_writable_place(payload_env) -> None:
    """`/dev` was a writable tmpfs sized at half the host's RAM: 48 files of 16 MiB in /dev/shm
    escaped the 64 MiB scratch and the 2 GiB limit, and stayed there for the worker's later calls
    and other episodes."""
    fleet = Fleet([payload_env])
    try:
        ep = await fleet.create_episode("payloads")
        for path in ("/dev/shm/fill", "/dev/fill", "/dev/mqueue/fill"):
            result = await fleet.call(ep.id, "write_file", {"path": path})
            assert result.is_error, f"{path}: {result.text}"
        mounts = await fleet.call(ep.id, "writable_mounts", {})
        assert not mounts.is_error, mounts.text
        writable = json.loads(mounts.text)
        assert [(point, kind) for point, kind, _ in writable] == [("/tmp", "tmpfs")], writable
        assert "size=65536k" in writable[0][2], writable
        assert (await fleet.call(ep.id, "write_file", {"path": "/tmp/scratch.txt"})).text == "written"
    finally:
        await fleet.aclose()


async def test_reading_a_host_file_fails(payload_env, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-HOST-DATA")
    fleet = Fleet([payload_env])
    try:
        ep = await fleet.create_episode("payloads")
        for path in (secret, payload_env.root / "tools.py", Path("/etc/passwd")):
            result = await fleet.call(ep.id, "read_file", {"path": str(path)})
            assert result.is_error, result.text
            assert "TOP-SECRET" not in result.text and "root:" not in result.text
        await _bystander_still_works(fleet)
    finally:
        await fleet.aclose()


async def test_the_worker_sees_no_envforge_code_but_the_core_and_the_sandbox(payload_env) -> None:
    """The worker's view held all of server/ (the runtime, the transports, the package's
    `__init__`: code it never runs); the core and the sandbox are all it loads, and all it sees."""
    server = Path(envforge.server.__file__).resolve().parent
    fleet = Fleet([payload_env])
    try:
        ep = await fleet.create_episode("payloads")
        hidden = [
            server / "__init__.py",
            server / "runtime" / "loader.py",
            server / "transports" / "http_app.py",
            server.parent / "api" / "__init__.py",
        ]
        for path in hidden:
            result = await fleet.call(ep.id, "read_file", {"path": str(path)})
            assert result.is_error, f"{path} is visible: {result.text[:60]}"
        seen = await fleet.call(ep.id, "read_file", {"path": str(server / "core" / "errors.py")})
        assert not seen.is_error and "class ToolError" in seen.text, seen.text[:200]
    finally:
        await fleet.aclose()


async def test_network_connections_fail(payload_env) -> None:
    accepted: list[bytes] = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(6)
    port = server.getsockname()[1]

    def accept() -> None:
        try:
            conn, _ = server.accept()
            accepted.append(conn.recv(100))
            conn.close()
        except OSError:
            pass

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    fleet = Fleet([payload_env])
    try:
        ep = await fleet.create_episode("payloads")
        result = await fleet.call(ep.id, "connect", {"port": port})
        assert result.is_error, result.text
        await _bystander_still_works(fleet)
    finally:
        await fleet.aclose()
        server.close()
        listener.join(7)
    assert accepted == []


async def test_environment_variables_do_not_leak(payload_env) -> None:
    assert os.environ["OPENAI_API_KEY"] == "sk-fake-parent-secret-123"
    fleet = Fleet([payload_env])
    try:
        ep = await fleet.create_episode("payloads")
        result = await fleet.call(ep.id, "environment", {})
        assert not result.is_error, result.text
        assert "sk-fake" not in result.text and "OPENAI_API_KEY" not in result.text
        assert "LITELLM" not in result.text and "PATH" not in json.loads(result.text)
    finally:
        await fleet.aclose()


async def test_new_processes_cannot_be_started(
    payload_env, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "spawned.txt"
    fleet = Fleet([payload_env])
    try:
        ep = await fleet.create_episode("payloads")
        spawned = await fleet.call(ep.id, "spawn", {"path": str(marker)})
        # the client hears an env error; the log keeps the worker's reason: the OS said no
        assert spawned.kind == "env_error", spawned.text
        forked = await fleet.call(ep.id, "fork", {})
        assert forked.kind == "env_error", forked.text
        assert caplog.text.count("Operation not permitted") >= 2, caplog.text[-2000:]
        assert not marker.exists()
        await _bystander_still_works(fleet)
    finally:
        await fleet.aclose()


async def test_memory_exhaustion_fails_the_call_only(payload_env) -> None:
    fleet = Fleet([payload_env])
    try:
        ep = await fleet.create_episode("payloads")
        result = await fleet.call(ep.id, "eat_memory", {})
        assert result.is_error, result.text
        await _bystander_still_works(fleet)
    finally:
        await fleet.aclose()


async def test_cpu_exhaustion_is_stopped_and_the_worker_restarts(payload_env) -> None:
    fleet = Fleet([payload_env])
    try:
        ep = await fleet.create_episode("payloads")
        with anyio.fail_after(20):
            result = await fleet.call(ep.id, "spin", {})
        assert result.is_error, result.text
        await _bystander_still_works(fleet)
    finally:
        await fleet.aclose()


@pytest.mark.parametrize("how", ["timer", "task"])
async def test_work_left_behind_by_a_call_does_not_run_after_it(payload_env, how: str) -> None:
    """The per-call CPU budget could be lifted (its hard limit was infinite) and a `call_later`
    left by the call spun on after it returned, unmetered, for as long as it liked."""
    fleet = Fleet([payload_env])
    try:
        ep = await fleet.create_episode("payloads")
        before = float((await fleet.call(ep.id, "cpu_used", {})).text)
        left = await fleet.call(ep.id, "spin_later", {"seconds": 4.0, "how": how})
        assert left.text == "kept", left.text  # the hard limit cannot be raised
        await anyio.sleep(2.0)  # the timer was due after 0.2 s, the task at once
        with anyio.fail_after(3):  # a spin holding the loop would delay this call until it ends
            after = float((await fleet.call(ep.id, "cpu_used", {})).text)
        assert after - before < 1.0, f"{after - before:.1f} CPU seconds used between two calls"
        await _bystander_still_works(fleet)
    finally:
        await fleet.aclose()


async def test_the_hard_cpu_limit_bounds_a_worker_that_lifts_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Raising the soft limit to the hard one gains at most the worker's lifetime budget: the
    kernel kills it there, long before the call's time limit, and the next call gets a new one."""
    limits = dataclasses.replace(
        confined_tools_module.DEFAULT_LIMITS,
        call_timeout_s=30.0,
        cpu_seconds_per_call=3,
        cpu_seconds_per_worker=8,
    )
    monkeypatch.setattr(confined_tools_module, "DEFAULT_LIMITS", limits)
    env = load_env(make_confined_env(tmp_path / "payloads", PAYLOAD_TOOLS), static_gate=False)
    fleet = Fleet([env])
    try:
        ep = await fleet.create_episode("payloads")
        with anyio.fail_after(20):
            result = await fleet.call(ep.id, "spin_past_the_budget", {})
        assert result.kind == "env_error", result.text
        await _bystander_still_works(fleet)
    finally:
        await fleet.aclose()


async def test_a_worker_that_dies_mid_call_leaves_no_partial_write(
    payload_env, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = Fleet([payload_env])
    try:
        ep = await fleet.create_episode("payloads")
        died = await fleet.call(ep.id, "add_then_die", {"body": "half"})
        assert died.kind == "env_error", died.text
        assert "died" in caplog.text, caplog.text[-2000:]
        assert (await fleet.call(ep.id, "count_notes", {})).text == "1"
        await _bystander_still_works(fleet)
    finally:
        await fleet.aclose()


async def test_two_episodes_share_one_worker_concurrently(payload_env) -> None:
    fleet = Fleet([payload_env])
    try:
        a = await fleet.create_episode("payloads")
        b = await fleet.create_episode("payloads")
        assert (await fleet.call(a.id, "count_notes", {})).text == "1"  # start the worker first
        results: dict[str, str] = {}

        async def run(ep_id: str, body: str) -> None:
            res = await fleet.call(ep_id, "add_slowly", {"body": body, "seconds": 0.3})
            assert not res.is_error, res.text
            results[body] = res.text

        with anyio.fail_after(5):  # sequential would be fine too; concurrent is the point
            async with anyio.create_task_group() as tg:
                tg.start_soon(run, a.id, "from a")
                tg.start_soon(run, b.id, "from b")
        assert results == {"from a": "both", "from b": "both"}
        state_a, _ = await fleet.export(a.id)
        state_b, _ = await fleet.export(b.id)
        assert [r["body"] for r in state_a["notes"]] == ["seed", "from a", "from a again"]
        assert [r["body"] for r in state_b["notes"]] == ["seed", "from b", "from b again"]
    finally:
        await fleet.aclose()


async def test_cancelling_a_call_mid_way_leaves_no_partial_write(payload_env) -> None:
    fleet = Fleet([payload_env])
    try:
        ep = await fleet.create_episode("payloads")
        assert (await fleet.call(ep.id, "count_notes", {})).text == "1"  # the worker is up: the
        with anyio.move_on_after(1.0) as scope:  # first write lands at once, then the call waits
            await fleet.call(ep.id, "add_slowly", {"body": "cancelled", "seconds": 30})
        assert scope.cancelled_caught
        await anyio.sleep(0.2)
        state, _ = await fleet.export(ep.id)
        assert [r["body"] for r in state["notes"]] == ["seed"]
        assert (await fleet.call(ep.id, "count_notes", {})).text == "1"
        added = await fleet.call(ep.id, "add_note", {"body": "after"})
        assert not added.is_error
        state, _ = await fleet.export(ep.id)
        assert [r["body"] for r in state["notes"]] == ["seed", "after"]
    finally:
        await fleet.aclose()


def test_without_confinement_a_confined_env_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Fail closed: with bubblewrap missing from PATH the env does not load, and says why in one line."""

    root = make_confined_env(tmp_path / "payloads", PAYLOAD_TOOLS)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.delenv(confinement.ALLOW_UNCONFINED_ENV, raising=False)
    confinement.confinement_problem.cache_clear()
    try:
        with pytest.raises(EnvLoadError) as err:
            load_env(root, static_gate=False)
        message = str(err.value)
        assert "bubblewrap" in message and confinement.ALLOW_UNCONFINED_ENV in message
        assert len(message.splitlines()) == 1
    finally:
        confinement.confinement_problem.cache_clear()


async def test_the_operator_opt_out_runs_unconfined_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`ENVFORGE_ALLOW_UNCONFINED=1` is explicit, logged, and still clears the environment."""
    root = make_confined_env(tmp_path / "payloads", PAYLOAD_TOOLS)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setenv(confinement.ALLOW_UNCONFINED_ENV, "1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-parent-secret-123")
    confinement.confinement_problem.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="envforge.server.sandbox.confinement"):
            env = load_env(root, static_gate=False)
        assert any("WITHOUT OS confinement" in r.getMessage() for r in caplog.records)
        fleet = Fleet([env])
        try:
            ep = await fleet.create_episode("payloads")
            assert (await fleet.call(ep.id, "count_notes", {})).text == "1"
            leaked = await fleet.call(ep.id, "environment", {})
            assert "sk-fake" not in leaked.text
        finally:
            await fleet.aclose()
    finally:
        confinement.confinement_problem.cache_clear()


def test_an_interpreter_under_tmp_is_confined_not_hidden() -> None:
    """A checkout (and its venv) under /tmp: the sandbox's scratch is a tmpfs on /tmp, and mounted
    over the interpreter's binds it hid them, so every confined env refused to load (`execvp
    .../python: No such file or directory`) on a machine whose checkout lived in /tmp."""
    import shutil
    import subprocess
    import sys
    import tempfile

    if confinement.confinement_problem() is not None:
        pytest.skip(f"no confinement here: {confinement.confinement_problem()}")
    root = Path(tempfile.mkdtemp(prefix="envforge-checkout-", dir="/tmp"))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
        deps = os.pathsep.join(p for p in sys.path if p.endswith("site-packages"))
        probe = textwrap.dedent(
            """
            import os, site, subprocess
            for path in os.environ["DEPS"].split(os.pathsep):  # .pth files too (an editable install)
                site.addsitedir(path)
            from envforge.server.sandbox import confinement
            assert confinement.PYTHON.startswith("/tmp/"), confinement.PYTHON
            print("problem:", confinement.confinement_problem())
            cmd = confinement.bwrap_command([confinement.PYTHON, "-I", "-c", "import sys; print(sys.prefix)"])
            done = subprocess.run(cmd, capture_output=True, text=True, env={})
            print("sandboxed:", done.returncode, done.stdout.strip() or done.stderr.strip())
            """
        )
        out = subprocess.run(
            [str(root / "venv" / "bin" / "python"), "-c", probe],
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"], "DEPS": deps},
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert "problem: None" in out.stdout, out.stdout
        assert f"sandboxed: 0 {root / 'venv'}" in out.stdout, out.stdout
    finally:
        shutil.rmtree(root, ignore_errors=True)
