"""What synthesis, verification and scoring share about one env, by job.

A `SynthContext` is one env's synthesis run: its tool graph as walks look it up (`GraphIndex`,
`graphindex.py`), the states tasks start from and what is derived from them (`StateCache`,
`states.py`), the scratch episodes, call memo and replays (`Replayer`, `replayer.py`), fresh-entity
setups (`setup.py`), what walks read off results (`results.py`), and which calls have worked so
far (`outcomes.py`), whose story a task is (`principal.py`) and who may ask for each write
(`roles.py`). Each part keeps its own caches, all bounded (`memo.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from envforge.server import Environment, Fleet

from ..graph.domains import derive_domains, foreign_keys, key_columns
from ..graph.graphindex import GraphIndex
from ..task.models import ParamDomain, ToolGraph
from ..task.statediff import primary_keys
from ..wording.phrases import Phrases, load_phrases
from .outcomes import Outcomes
from .principal import Ownership
from .replayer import Replayer
from .results import ResultReadings
from .roles import Roles, env_roles
from .setup import SetupPlanner
from .states import StateCache


@dataclass
class SynthContext:
    env: Environment
    graph: ToolGraph
    fleet: Fleet
    domains: dict[str, dict[str, ParamDomain]] = field(default_factory=dict)
    pks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    key_names: set[str] = field(default_factory=set)
    # What walks read off each parsed result (`results.py`): memoised reads share their objects.
    readings: ResultReadings = field(default_factory=ResultReadings)
    # Which calls have worked so far in this run, for walks to weigh their choices by.
    outcomes: Outcomes = field(default_factory=Outcomes)
    index: GraphIndex = field(init=False)
    states: StateCache = field(init=False)
    replayer: Replayer = field(init=False)
    _setups: SetupPlanner | None = field(default=None, init=False)
    _phrases: Phrases | None = field(default=None, init=False)
    _ownership: Ownership | None = field(default=None, init=False)
    _roles: Roles | None = field(default=None, init=False)
    _references: dict[str, str] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.index = GraphIndex(self.env, self.graph, self.domains, self.key_names)
        self.states = StateCache(self.env, self.pks)
        self.replayer = Replayer(self.env, self.fleet, self.states)

    @classmethod
    def create(cls, env: Environment, graph: ToolGraph, fleet: Fleet) -> SynthContext:
        return cls(
            env=env,
            graph=graph,
            fleet=fleet,
            domains=derive_domains(env),
            pks=primary_keys(env.tables),
            key_names=key_columns(env),
        )

    @property
    def setups(self) -> SetupPlanner:
        """Fresh-entity setups for this env (`setup.py`), planned once."""
        if self._setups is None:
            self._setups = SetupPlanner(self.env, self.domains, self.replayer.scratch)
        return self._setups

    @property
    def phrases(self) -> Phrases:
        """How this env's users speak of its entities and actions (`phrases.py`), loaded once."""
        if self._phrases is None:
            self._phrases = load_phrases(self.env)
        return self._phrases

    @property
    def references(self) -> dict[str, str]:
        """Column -> the table it references, for columns not named after it ("assigned_to" ->
        "employees"): what a person calls such a value ("the employee"), worked out once."""
        if self._references is None:
            refs: dict[str, str] = {}
            for child, parents in sorted(foreign_keys(self.env).items()):
                column = child.split(".", 1)[1]
                if not column.endswith("_id") and len(parents) == 1:
                    refs.setdefault(column, parents[0].split(".", 1)[0])
            self._references = refs
        return self._references

    @property
    def ownership(self) -> Ownership:
        """The env's owner entity and who owns each row (`principal.py`), worked out once."""
        if self._ownership is None:
            self._ownership = Ownership(self.env, self.graph, self.pks)
        return self._ownership

    @property
    def roles(self) -> Roles:
        """Who may ask for each write: the principal or staff (`roles.py`), worked out once."""
        if self._roles is None:
            self._roles = env_roles(self.env, self.ownership, self.domains or derive_domains(self.env))
        return self._roles

    def close(self) -> None:
        """Close the pooled connections (the fleet's episodes are the fleet's to close)."""
        self.replayer.close()
