"""The data that task synthesis produces and the scorer reads: tool graph, task DAG, task, score.

These are the boundary models: `graph.json` and `tasks.jsonl` are their JSON dumps, and the
evaluation harness reads tasks back through them, so every field is explicit and typed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

Row = dict[str, Any]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- tool graph


class ParamDomain(_Model):
    """Where a parameter's legal values come from, as derived from the schema (never guessed)."""

    param: str
    columns: list[str] = Field(default_factory=list, description="'table.column' whose values fit it")
    enum: list[Any] = Field(default_factory=list, description="values listed by the JSON schema")
    type: str = Field("string", description="JSON-schema type of the parameter (or of its items)")
    is_list: bool = False


class ToolNode(_Model):
    """One tool with its measured footprint: what it read and wrote while probed on the seed state."""

    name: str
    read_only: bool
    parameters: list[str]
    required: list[str]
    domains: list[ParamDomain]
    reads: dict[str, list[str]] = Field(description="table -> columns read (SQLite authorizer)")
    writes: dict[str, list[str]] = Field(description="table -> columns written ('*' for insert/delete)")
    result_keys: list[str] = Field(description="JSON keys seen in successful results")
    probes: int
    successes: int


class GraphEdge(_Model):
    """A returned value of `source` (under JSON key `key`) can feed parameter `param` of `target`."""

    source: str
    target: str
    key: str
    param: str
    evidence: Literal["name", "values"]


class StateEdge(_Model):
    """`writer` changes tables that `reader` reads: an ordering dependency, not a value flow."""

    writer: str
    reader: str
    tables: list[str]


class ToolGraph(_Model):
    env: str
    tools: list[ToolNode]
    edges: list[GraphEdge]
    state_edges: list[StateEdge]

    def tool(self, name: str) -> ToolNode:
        return next(t for t in self.tools if t.name == name)

    def out_edges(self, source: str) -> list[GraphEdge]:
        return [e for e in self.edges if e.source == source]


@dataclass(frozen=True)
class ToolShape:
    """What a caller knows of a tool before calling it: its name, whether it only reads, and its
    parameters (all, and the required ones). The adversaries plan their calls from these; the
    graph index (synthesis) and the harness (from MCP's tool list) make them."""

    name: str
    read_only: bool
    parameters: tuple[str, ...]
    required: tuple[str, ...]


# --------------------------------------------------------------------------- state diffs


class RowUpdate(_Model):
    key: Row = Field(description="primary-key columns of the row")
    before: Row = Field(description="changed columns, old values")
    after: Row = Field(description="changed columns, new values")


class TableDiff(_Model):
    inserted: list[Row] = Field(default_factory=list)
    deleted: list[Row] = Field(default_factory=list)
    updated: list[RowUpdate] = Field(default_factory=list)


StateDiff = dict[str, TableDiff]


# --------------------------------------------------------------------------- task DAG

ReasonOp = Literal["argmax", "argmin", "filter", "count", "sum", "branch"]


Requestor = Literal["assistant", "user"]
"""Who makes a call (τ²-bench's `requestor`): the agent, or the simulated user on their own tools
(dual control, the env's `side="user"` tools)."""


class Call(_Model):
    name: str
    arguments: dict[str, Any]
    requestor: Requestor = "assistant"

    @model_serializer(mode="wrap")
    def _agent_by_default(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A call of the agent's is written as it always was (name and arguments), so task files
        and records of single-control envs keep their bytes; a user's call names its requestor."""
        data: dict[str, Any] = handler(self)
        if data.get("requestor") == "assistant":
            del data["requestor"]
        return data


class ArgSource(_Model):
    """Where a call's argument comes from: a fact the user gives, or an earlier node's result."""

    param: str
    source: Literal["user", "node"]
    node: str | None = None
    key: str | None = None


class CallNode(_Model):
    """A step that calls a tool (executed, or the untaken side of a branch)."""

    id: str
    kind: Literal["call"] = "call"
    text: str = Field(description="what this step does, in words (used to render the instruction)")
    call: Call
    write: bool = False
    executed: bool = True
    expect_error: bool = False
    args: list[ArgSource] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _drop_reason_defaults(cls, data: Any) -> Any:
        return _without_defaults(data, REASON_FIELDS)

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _flat_node(handler(self))


class ReasonNode(_Model):
    """A step that reasons over an earlier result: picks (argmax/argmin/filter), counts, sums or
    branches."""

    id: str
    kind: Literal["reason"] = "reason"
    text: str = Field(description="what this step does, in words (used to render the instruction)")
    op: ReasonOp
    source: str | None = Field(None, description="node whose result is reasoned over")
    path: list[str] = Field(default_factory=list, description="JSON keys from the result to the list/value")
    field: str | None = None
    equals: Any = None
    select: str | None = None
    comparator: Literal[">", "<"] | None = None
    threshold: float | None = None
    then_node: str | None = None
    else_node: str | None = None
    value: Any = None

    @model_validator(mode="before")
    @classmethod
    def _drop_call_defaults(cls, data: Any) -> Any:
        return _without_defaults(data, CALL_FIELDS)

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _flat_node(handler(self))


DagNode = Annotated[CallNode | ReasonNode, Field(discriminator="kind")]
"""A DAG step, by `kind`. On file every node carries every field of both kinds, in one order (the
other kind's at their defaults), as `tasks.jsonl` has always been written; read back, a node
keeps only its own kind's fields, and one whose other-kind fields are not at their defaults is
refused."""

# The fields only one kind of node has, with their defaults, in file order.
CALL_FIELDS: dict[str, Any] = {
    "call": None,
    "write": False,
    "executed": True,
    "expect_error": False,
    "args": [],
}
REASON_FIELDS: dict[str, Any] = {
    "op": None,
    "source": None,
    "path": [],
    "field": None,
    "equals": None,
    "select": None,
    "comparator": None,
    "threshold": None,
    "then_node": None,
    "else_node": None,
    "value": None,
}
_NODE_FIELDS = ("id", "kind", "text", *CALL_FIELDS, *REASON_FIELDS)
_DEFAULTS = {**CALL_FIELDS, **REASON_FIELDS}


def _without_defaults(data: Any, others: dict[str, Any]) -> Any:
    """`data` without the other kind's fields where they hold their defaults (as files have them)."""
    if not isinstance(data, dict) or not any(k in data for k in others):
        return data
    return {k: v for k, v in data.items() if k not in others or v != others[k]}


def _flat_node(own: dict[str, Any]) -> dict[str, Any]:
    """A node's fields as files hold them: both kinds', in one order, the other kind's at their defaults."""
    return {k: own[k] if k in own else _default(k) for k in _NODE_FIELDS}


def _default(name: str) -> Any:
    value = _DEFAULTS[name]
    return [] if value == [] else value


class DagEdge(_Model):
    source: str
    target: str
    kind: Literal["data", "control", "state"]
    label: str = ""


class Principal(_Model):
    """Who the task's user is: the row the walk stays on (a customer, a member, a traveller), so
    the persona, and every entity the task touches, belong to one person."""

    table: str
    key: dict[str, Any]
    name: str | None = None


class Dag(_Model):
    nodes: list[DagNode]
    edges: list[DagEdge]
    principal: Principal | None = None

    def node(self, node_id: str) -> DagNode:
        return next(n for n in self.nodes if n.id == node_id)


# --------------------------------------------------------------------------- task


class Fact(_Model):
    name: str
    value: Any


KNOWN_FACTS_LINE = "You know:"
"""How the instruction's line of the user's known facts starts."""
ANSWERS_LINE = "Make sure the agent tells you"
"""How the instruction's line of the answers the agent must find starts."""


class UserScenario(_Model):
    persona: str
    instruction: str = Field(description="what the user wants, in the user's words")
    known_facts: list[Fact] = Field(description="given to the agent only when asked")
    must_be_told: list[str] = Field(description="what the user must hear from the agent")
    instruction_source: str = "template"

    def without_answers(self) -> str:
        """The instruction less its answers line, which holds the values the agent must find.

        The only form of the instruction an agent-facing prompt may show (a rollout with no
        simulated user opens with it); the simulated user says less still (no known-facts line:
        `harness.users.request_text`)."""
        return "\n".join(ln for ln in self.instruction.splitlines() if not ln.startswith(ANSWERS_LINE))


class RowCheck(_Model):
    table: str
    key: Row
    row: Row | None = Field(description="expected final row (volatile columns dropped); None: deleted")


class Checkpoint(_Model):
    node: str
    tool: str
    rows: list[RowCheck]


class Difficulty(_Model):
    calls: int
    writes: int
    reasoning: int
    depth: int
    tables: int


class RewardPart(StrEnum):
    """The parts a reward can be the product of; `synth/task/rewards.py` has one scorer per part.

    A StrEnum so that task files and run records keep their plain strings (`"state"`) and a
    member compares equal to its string.
    """

    STATE = "state"  # the final state matches the golden one
    OUTPUTS = "outputs"  # every required output was communicated
    CHECKPOINTS = "checkpoints"  # partial credit: write checkpoints holding their golden rows
    ACTIONS = "actions"  # τ²'s action matching on the agent's calls
    NL_ASSERTIONS = "nl_assertions"  # natural-language outcomes, judged by an LLM
    POLICY = "policy"  # the env's declared policy rules kept, judged on the trajectory
    ENV_ASSERTIONS = "env_assertions"  # the env's check tools hold on the final state (τ² telecom)


# the parts a task is scored on when its file names none
DEFAULT_REWARD_BASIS: tuple[RewardPart, ...] = (RewardPart.STATE, RewardPart.OUTPUTS)


AnswerRule = Literal["exact", "substring"]
"""How required outputs are found in the agent's messages (synth/task/scoring.py, docs/scoring.md):
`exact` (whole values, no spread of candidates) or `substring` (τ-bench's rule, what τ² scores)."""


class ActionCheck(_Model):
    """A call the agent is expected to make (τ²'s ACTION basis): same name, same `compare_args`."""

    name: str
    arguments: dict[str, Any]
    compare_args: list[str] | None = Field(None, description="arguments compared; None: all of them")


class EnvAssertion(_Model):
    """A fact about the final state that a check tool of the env asserts (τ²-bench telecom's
    `env_assertions`): the env's `side="check"` tool `func_name`, called with `arguments` on the
    final state, must return `assert_value` (compared as the agent would read both)."""

    env_type: Literal["agent", "user"] = Field(description="whose state it asserts on (τ²'s toolkit)")
    func_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    assert_value: Any = True
    message: str | None = None


class Task(_Model):
    id: str
    env: str
    seed: str
    dag: Dag
    setup: StateDiff = Field(default_factory=dict, description="task-specific changes to the seed state")
    scenario: UserScenario
    golden_calls: list[Call]
    golden_hash: str = Field(description="state_hash of the exported golden end state")
    golden_cents_hash: str = Field(description="hash of the golden state with floats rounded to cents")
    golden_diff: StateDiff
    required_outputs: list[str]
    checkpoints: list[Checkpoint]
    difficulty: Difficulty
    reward_basis: list[RewardPart] = Field(default_factory=lambda: list(DEFAULT_REWARD_BASIS))
    source: str = Field("synth", description="'synth' for synthesized tasks, 'tau2' for imported ones")
    split: list[str] = Field(default_factory=list, description="named splits holding the task (train, test)")
    nl_assertions: list[str] = Field(default_factory=list, description="statements an LLM judge checks")
    action_checks: list[ActionCheck] = Field(default_factory=list)
    answer_rule: AnswerRule = Field(
        "exact", description="how required outputs are found; unset: 'substring' for τ² imports, else 'exact'"
    )
    env_assertions: list[EnvAssertion] = Field(
        default_factory=list, description="check tools the final state must satisfy (omitted when none)"
    )

    @model_validator(mode="before")
    @classmethod
    def _default_answer_rule(cls, data: Any) -> Any:
        """Task files written before the field existed keep the rule their source implies."""
        if isinstance(data, dict) and "answer_rule" not in data and data.get("source") == "tau2":
            return {**data, "answer_rule": "substring"}
        return data

    @model_serializer(mode="wrap")
    def _without_empty_assertions(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A task with no env assertions is written as before the field existed (files keep their bytes)."""
        data: dict[str, Any] = handler(self)
        if not data.get("env_assertions", True):
            del data["env_assertions"]
        return data

    @property
    def user_calls(self) -> list[Call]:
        """The golden calls the simulated user makes on their own tools, in golden order."""
        return [c for c in self.golden_calls if c.requestor == "user"]


class Score(_Model):
    reward: float
    state_match: bool
    outputs: float = Field(description="fraction of required outputs found in the agent's messages")
    outputs_missing: list[str]
    checkpoints: float = Field(description="fraction of checkpoints satisfied by the final state")
    checkpoints_passed: int
    checkpoints_total: int
    basis: list[RewardPart]
    not_judged: list[RewardPart] = Field(
        default_factory=list, description="parts of the basis the scorer could not judge (not in the reward)"
    )
    answer_rule: AnswerRule | None = Field(
        None, description="the rule that judged the outputs part; None in records older than the field"
    )
    policy_broken: list[str] = Field(
        default_factory=list, description="the declared policy rules the trajectory broke, each with how"
    )
