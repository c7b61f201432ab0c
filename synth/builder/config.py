"""How a task build is configured, and how it fails."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SynthConfig:
    min_calls: int = 2
    max_calls: int = 7
    p_reason: float = 0.7
    p_branch: float = 0.35
    p_summary: float = 0.4
    p_refusal: float = 0.05
    tries_per_step: int = 8
    # Share of tasks whose initial state adds a fresh entity to the seed (`setup.py`); drawn from a
    # stream of its own, so that without steering a task without one is built exactly as it would
    # be with p_setup=0.
    p_setup: float = 0.2
    # Walks weigh their choices by what has worked in earlier attempts of the run (`outcomes.py`):
    # far fewer failed tries, at the price of attempts depending on the attempts before them.
    steer: bool = True
    # Tasks are steered towards the intents (write tools, reasoning kinds, role) the run has
    # shipped least of lately, so any ten in a row ask for several things (`mix.py`).
    vary: bool = True


class BuildFailed(Exception):
    """The walk could not be completed; `reason` is counted in the synthesis report."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
