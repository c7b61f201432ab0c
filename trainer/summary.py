"""What a training run did, said plainly: updates applied and skipped, peak memory, and how far its
reward can be trusted.

A two-step run once printed "reward 0.000 -> 0.000" while both updates had been skipped (every
group's rollouts earned the same reward, so every advantage was 0 and nothing was learned): only
`metrics.jsonl` said so, beside a tokens/s figure of a forward pass that never ran, and the run
still wrote a full checkpoint of unchanged weights. `summarize` turns the step metrics (and the
held-out evaluations, when there are any) into the lines `envforge train` ends with and the
`ran` block of `run.json`.
"""

from __future__ import annotations

import json
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .loop import StepMetrics

NOISY_STEPS = 20
"""Below this many steps a run's step rewards are read as noise: each step's mean is over a few
episodes, and one lucky group moves it by more than any learning a short run does."""


def peak_memory_mib(device: str) -> tuple[float, float | None]:
    """(peak resident MiB of this process, peak MiB the GPU allocator handed out or None off one)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    rss_mib = rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024
    gpu: float | None = None
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.max_memory_allocated(torch.device(device)) / (1024 * 1024)
    return round(rss_mib, 1), None if gpu is None else round(gpu, 1)


@dataclass
class RunSummary:
    """A run's outcome: counts of updates by fate, peak memory, held-out rewards and the lines to print."""

    steps: int
    updates_applied: int
    updates_skipped: int
    updates_nonfinite: int
    peak_memory_mib: float
    peak_gpu_mib: float | None
    held_out: list[float] = field(default_factory=list)
    """Held-out mean reward per evaluation, in order (`eval.jsonl`); empty when none ran."""
    user_errors_flagged: int = 0
    user_errors_injected: int = 0
    user_errors_caught: int = 0

    @property
    def mask_precision(self) -> float | None:
        """Of the episodes the detector flagged, the share whose user was made to err."""
        return self.user_errors_caught / self.user_errors_flagged if self.user_errors_flagged else None

    @property
    def mask_recall(self) -> float | None:
        """Of the episodes whose user was made to err, the share the detector flagged."""
        return self.user_errors_caught / self.user_errors_injected if self.user_errors_injected else None

    @property
    def all_skipped(self) -> bool:
        """Every update was skipped: every group in every step had zero reward variance."""
        return self.steps > 0 and self.updates_skipped == self.steps

    def ran(self) -> dict[str, Any]:
        """The `ran` block of `run.json`."""
        return {
            "steps": self.steps,
            "updates_applied": self.updates_applied,
            "updates_skipped": self.updates_skipped,
            "updates_nonfinite": self.updates_nonfinite,
            "peak_memory_mib": self.peak_memory_mib,
            "peak_gpu_mib": self.peak_gpu_mib,
            "held_out_rewards": self.held_out,
            "user_errors": {
                "flagged": self.user_errors_flagged,
                "injected": self.user_errors_injected,
                "caught": self.user_errors_caught,
                "mask_precision": self.mask_precision,
                "mask_recall": self.mask_recall,
            },
        }

    def lines(self, metrics: list[StepMetrics]) -> list[tuple[str, str]]:
        """(kind, text) lines after `done:`: kind is `warning` or `note`."""
        out: list[tuple[str, str]] = []
        if self.all_skipped:
            out.append(
                (
                    "warning",
                    "every group had zero reward variance (all its rollouts earned the same reward) in "
                    f"all {self.steps} steps: no update was applied and the weights are unchanged "
                    "(sample more diversely: --temperature 1, more --rollouts-per-task, or tasks the "
                    "model solves sometimes)",
                )
            )
        memory = f"peak memory {self.peak_memory_mib / 1024:.1f} GiB resident"
        if self.peak_gpu_mib is not None:
            memory += f", {self.peak_gpu_mib / 1024:.1f} GiB GPU"
        out.append(("note", memory))
        if self.user_errors_injected or self.user_errors_flagged:
            p, r = self.mask_precision, self.mask_recall
            out.append(
                (
                    "note",
                    f"user errors: {self.user_errors_injected} injected, {self.user_errors_flagged} flagged, "
                    f"{self.user_errors_caught} both: mask precision {'-' if p is None else f'{p:.2f}'}, "
                    f"recall {'-' if r is None else f'{r:.2f}'}",
                )
            )
        if self.steps < NOISY_STEPS and metrics:
            episodes = len(metrics[0].staleness)  # one entry per episode of the step's batch
            held = (
                f"held-out reward {self.held_out[0]:.3f} -> {self.held_out[-1]:.3f} (eval.jsonl)"
                if len(self.held_out) >= 2
                else "no held-out figure (--tasks lookup --eval-every N measures one)"
            )
            out.append(
                (
                    "note",
                    f"{self.steps} step(s) of {episodes} episodes each: the step reward moves by chance at "
                    f"this size, read it over {NOISY_STEPS}+ steps; {held}",
                )
            )
        return out


def summarize(metrics: list[StepMetrics], out: Path) -> RunSummary:
    """The summary of a run whose step metrics are `metrics` and whose outputs are in `out`."""
    peaks = [m.peak_memory_mib for m in metrics]
    gpus = [m.peak_gpu_mib for m in metrics if m.peak_gpu_mib is not None]
    return RunSummary(
        steps=len(metrics),
        updates_applied=sum(1 for m in metrics if not m.update_skipped and not m.update_nonfinite),
        updates_skipped=sum(1 for m in metrics if m.update_skipped),
        updates_nonfinite=sum(1 for m in metrics if m.update_nonfinite),
        peak_memory_mib=max(peaks, default=0.0),
        peak_gpu_mib=max(gpus) if gpus else None,
        held_out=read_held_out(out / "eval.jsonl"),
        user_errors_flagged=sum(m.user_errors_flagged for m in metrics),
        user_errors_injected=sum(m.user_errors_injected for m in metrics),
        user_errors_caught=sum(m.user_errors_caught for m in metrics),
    )


def read_held_out(path: Path) -> list[float]:
    """The held-out mean rewards of `eval.jsonl`, in order; none when the file is missing or empty."""
    if not path.exists():
        return []
    return [float(json.loads(line)["reward_mean"]) for line in path.read_text().splitlines() if line.strip()]
