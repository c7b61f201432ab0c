"""The harness's closed vocabularies, in one place: how trials end, whose fault an ending is, the
built-in agents and users, the control tokens of a conversation, and the reward parts (synth's).

StrEnums: a member is its string (`TrialStatus.COMPLETED == "completed"`), so run records keep
their plain strings on disk and records written before a vocabulary became an enum read back
unchanged.
"""

from __future__ import annotations

from enum import StrEnum

from envforge.synth import Adversary, RewardPart

__all__ = ["AgentName", "ControlToken", "Fault", "RewardPart", "Termination", "TrialStatus", "UserName"]


class TrialStatus(StrEnum):
    """How a trial ended, in detail; `FAULT_OF_STATUS` says whose side each ending is on."""

    COMPLETED = "completed"
    INFRA_FAILURE = "infra_failure"
    ENV_FAILURE = "env_failure"
    CONTEXT_OVERFLOW = "context_overflow"
    TIMEOUT = "timeout"
    MAX_TURNS = "max_turns"
    MAX_ERRORS = "max_errors"
    MALFORMED_OUTPUT = "malformed_output"
    NO_RESPONSE = "no_response"  # the agent kept saying nothing to the user after being nudged


class Fault(StrEnum):
    """Whose side a trial's ending is on; decides pass^k counting and what `--resume` re-runs.

    - `none`: the conversation ended normally; the reward is the agent's.
    - `agent`: the agent's own doing (malformed or unknown tool calls, arguments that are not JSON,
      content that is not text, step/turn/tool-error limits, its own context overflow, running
      out of wall-clock time while it was the one working, turns that kept saying nothing to the
      user after the scripted user's nudges): reward 0, counted, never re-run.
    - `infra`: provider errors after retries, connection failures, a model server that did not
      answer in time, an env server that failed: not a measurement, left out, re-run by `--resume`.
    - `env`: the environment had a bug (a tool result of kind `env_error`) and the trial did not
      succeed: left out of pass^k and reported; not re-run, since the same bug would recur.
    """

    NONE = "none"
    AGENT = "agent"
    INFRA = "infra"
    ENV = "env"


class Termination(StrEnum):
    """Why a conversation ended: the detail under a `TrialStatus` (a trial that raised ends with
    its status as its termination)."""

    USER_STOP = "user_stop"  # the user said `###STOP###`
    TRANSFER = "transfer"  # the user asked for a human (`###TRANSFER###`)
    IDLE_LOOP = "idle_loop"  # both sides only thanked, closed, refused or repeated (`harness/idle_loop.py`)
    AGENT_STOP = "agent_stop"  # the agent said `###STOP###`
    AGENT_EMPTY = "agent_empty"  # the agent said nothing (RL rollouts; in an eval: nudged, still nothing)
    MAX_TOOL_ERRORS = "max_tool_errors"
    MAX_STEPS = "max_steps"  # tool calls in one turn
    MAX_TURNS = "max_turns"
    TIMEOUT = "timeout"
    INFRA_FAILURE = TrialStatus.INFRA_FAILURE.value
    ENV_FAILURE = TrialStatus.ENV_FAILURE.value
    CONTEXT_OVERFLOW = TrialStatus.CONTEXT_OVERFLOW.value
    MALFORMED_OUTPUT = TrialStatus.MALFORMED_OUTPUT.value


class ControlToken(StrEnum):
    """τ-bench's in-band control tokens, said by the simulated user (and `STOP` by an agent)."""

    STOP = "###STOP###"  # satisfied, or giving up
    TRANSFER = "###TRANSFER###"  # asks to be handed to a human


class AgentName(StrEnum):
    """The built-in agents; any other `--agent` is a model (a litellm model string)."""

    ORACLE = "oracle"
    NOOP = "noop"
    RANDOM = "random"
    SPRAY = Adversary.SPRAY.value
    READ_ALL = Adversary.READ_ALL.value
    DOUBLE_WRITE = Adversary.DOUBLE_WRITE.value
    GOLDEN_PREFIX = Adversary.GOLDEN_PREFIX.value
    SKIP_POLICY = Adversary.SKIP_POLICY.value
    COPY_RESULT = Adversary.COPY_RESULT.value


class UserName(StrEnum):
    """The built-in simulated users; any other `--user` is a model playing the user (litellm)."""

    SCRIPTED = "scripted"
