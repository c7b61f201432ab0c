"""The synthesis report (`synthesis.json`): what was asked of which model, what each gate found, the cost.

Gate results keep every problem as text because their first reader is the model in the repair
round, and their second a person deciding why an env was rejected.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

GATES = ("static", "load", "probes", "llm_probe", "policy_rules", "tasks", "policy_kept")
REPORT_FILE = "synthesis.json"


class GateResult(BaseModel):
    name: str
    passed: bool
    checks: int = 0
    passed_checks: int = 0
    problems: list[str] = Field(default_factory=list)
    blame: list[str] = Field(
        default_factory=list,
        description="The artifacts to regenerate: schema, tools, seed, policy or policy_rules.",
    )
    seconds: float = 0.0

    @property
    def pass_rate(self) -> float:
        return self.passed_checks / self.checks if self.checks else (1.0 if self.passed else 0.0)


class RoundRecord(BaseModel):
    round: int
    gates: list[GateResult]
    repaired: list[str] = Field(default_factory=list, description="The stages regenerated after this round.")


class SynthesisReport(BaseModel):
    env: str
    status: Literal["accepted", "rejected"]
    reasons: list[str] = Field(default_factory=list)
    model: str
    api_base: str | None = None
    prompt_versions: dict[str, str]
    docs: list[str] = Field(default_factory=list, description="The documented tool names.")
    rounds: list[RoundRecord] = Field(default_factory=list)
    llm_calls: int = 0
    reused_answers: int = Field(0, description="Answers taken from an earlier run (`--resume`).")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    seed_rows: int = 0
    tasks: int = 0

    def final_gates(self) -> dict[str, float | None]:
        """Pass rate of each gate in the last round (None: not reached)."""
        last = {g.name: g.pass_rate for g in self.rounds[-1].gates} if self.rounds else {}
        return {g: last.get(g) for g in GATES}

    def gate_table(self) -> dict[str, dict[str, object]]:
        """Per gate, the last result: passed, pass rate and checks (for the report JSON)."""
        out: dict[str, dict[str, object]] = {}
        for r in self.rounds:
            for g in r.gates:
                out[g.name] = {
                    "passed": g.passed,
                    "pass_rate": round(g.pass_rate, 4),
                    "checks": g.checks,
                    "round": r.round,
                }
        return out


def write_report(report: SynthesisReport, root: Path) -> Path:
    data = report.model_dump(mode="json")
    data["gate_results"] = report.gate_table()
    path = Path(root) / REPORT_FILE
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def read_report(root: Path) -> SynthesisReport | None:
    path = Path(root) / REPORT_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        data.pop("gate_results", None)
        return SynthesisReport.model_validate(data)
    except ValueError:
        return None
