"""The user scenario: rendered deterministically from the DAG, optionally rewritten by an LLM.

The template is the source of truth. An LLM rewrite (through `litellm.acompletion`) only makes the
wording more natural; it is rejected whenever any needed fact (a value the user gives, or an
output the user must be told) is missing from it, so a rewrite can never change the task.
"""

from __future__ import annotations

import json
from typing import Any

from .models import Dag, Fact, UserScenario
from .scoring import normalize_text


def _persona(env_name: str, dag: Dag, data: dict[str, Any]) -> str:
    label = env_name.replace("_", " ")
    for node in dag.nodes:
        d = data.get(node.id)
        if isinstance(d, dict):
            for key in ("name", "full_name", "customer_name", "passenger_name", "requester"):
                if isinstance(d.get(key), str):
                    return f"{d[key]}, a user of the {label} service"
    return f"A user of the {label} service"


def render_scenario(
    env_name: str,
    dag: Dag,
    facts: list[Fact],
    outputs: list[str],
    data: dict[str, Any],
    output_labels: list[str] | None = None,
) -> UserScenario:
    """The templated scenario. `output_labels` say what each output is (entity and unit), so the
    user, and whoever reads the task, knows what a bare figure such as "2" counts."""
    lines = ["You want the agent to do the following, in this order:"]
    for i, node in enumerate(dag.nodes, start=1):
        text = node.text
        if node.kind == "call" and node.write and node.expect_error:
            text += " (this is expected to be refused; accept the refusal)"
        lines.append(f"{i}. {text}.")
    if facts:
        lines.append(
            "You know: "
            + "; ".join(f"{f.name} = {json.dumps(f.value, ensure_ascii=False)}" for f in facts)
            + ". Give these only when asked."
        )
    if outputs:
        labels = output_labels or [""] * len(outputs)
        told = [f"{label}: {value}" if label else value for label, value in zip(labels, outputs, strict=True)]
        lines.append("Make sure the agent tells you: " + "; ".join(told) + ".")
    return UserScenario(
        persona=_persona(env_name, dag, data),
        instruction="\n".join(lines),
        known_facts=list(facts),
        must_be_told=list(outputs),
    )


def needed_strings(scenario: UserScenario) -> list[str]:
    """Every fact value and expected output, as text that a rewrite must still contain."""
    out: list[str] = []
    for f in scenario.known_facts:
        values = f.value if isinstance(f.value, list) else [f.value]
        out.extend(v if isinstance(v, str) else json.dumps(v) for v in values)
    out.extend(scenario.must_be_told)
    return out


def missing_facts(scenario: UserScenario, text: str) -> list[str]:
    said = normalize_text(text)
    return [s for s in needed_strings(scenario) if normalize_text(s) not in said]


REWRITE_PROMPT = (
    "Rewrite this customer-support scenario as a natural first-person instruction for a person who "
    "will play the user. Keep every id, value and number exactly as written. Reply with the "
    "instruction only.\n\n{instruction}"
)


async def rewrite_scenario(
    scenario: UserScenario, model: str, **completion_kwargs: Any
) -> tuple[UserScenario, list[str]]:
    """(scenario, missing): the rewritten scenario, or the original plus what the rewrite lost."""
    import litellm

    response = await litellm.acompletion(
        model=model,
        messages=[{"role": "user", "content": REWRITE_PROMPT.format(instruction=scenario.instruction)}],
        temperature=0,
        **completion_kwargs,
    )
    text = (response.choices[0].message.content or "").strip()
    missing = missing_facts(scenario, text)
    if missing or not text:
        return scenario, missing or ["<empty rewrite>"]
    return scenario.model_copy(update={"instruction": text, "instruction_source": f"llm:{model}"}), []
