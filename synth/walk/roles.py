"""Who may ask for each write: the principal (the person a task is the story of: a patient, a
member) or staff, who act for no one (a restock, a car sent to maintenance).

A task's user is its principal, or, in a task without one, a member of staff; a patient asking to
"restock drug D-204 with quantity 30" is a patient cast as staff. The role of each write tool is
read off the env's own semantics, never listed per env:

1. Declared: an env whose `policy_rules.toml` has an `[identity]` rule names the writes that act
   for no principal in its `exempt` list ("A restock acts for no patient."); every other write is
   the principal's, since the policy makes the agent verify the principal before it.
2. Otherwise, from the tools' parameters and the ownership of rows (`principal.py`): a write with
   a parameter that can name the owner entity's row or a row it owns (`book_class(member_id, …)`,
   `return_car(rental_id)`) is the principal's; one whose parameters name only public rows
   (`restock_drug(drug_id, quantity)`) acts for no one, and is staff's.

An env without an owner entity has no principal: every write is staff's, and so is every task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from envforge.server import Environment

from ..task.models import ParamDomain, Principal, Task
from ..task.policy_rules import load_policy_rules
from ..wording.phrases import singular
from .principal import Ownership

STAFF = "staff"
"""The role of a user who acts for no principal."""


@dataclass(frozen=True)
class Roles:
    """One env's roles: the principal's (the owner table's noun, None without an owner entity) and
    which write tools each may ask for."""

    principal_role: str | None
    staff_writes: frozenset[str]
    principal_writes: frozenset[str]
    declared: bool
    """Whether the roles come from the env's `[identity]` rule (else from its parameters)."""

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles a task of this env can have, the principal's first."""
        own = (self.principal_role,) if self.principal_role and self.principal_writes else ()
        return own + ((STAFF,) if self.staff_writes else ())

    def role_of_write(self, tool: str) -> str:
        """Who may ask for write `tool`."""
        if tool in self.principal_writes and self.principal_role is not None:
            return self.principal_role
        return STAFF

    def role_of(self, principal: Principal | None) -> str:
        """The role of a task's user: its principal's, or staff's where it has none."""
        return STAFF if principal is None or self.principal_role is None else self.principal_role

    def may_call(self, role: str, tool: str) -> bool:
        """Whether a user of `role` may ask for `tool` (reads are anyone's)."""
        if tool in self.principal_writes:
            return role == self.principal_role
        if tool in self.staff_writes:
            return role == STAFF
        return True

    def mismatches(self, task: Task) -> list[str]:
        """The write tools of `task` (every write node, a refused or untaken one too: the user
        asks for it) that its user's role may not ask for."""
        role = self.role_of(task.dag.principal)
        writes = {n.call.name for n in task.dag.nodes if n.kind == "call" and n.write}
        return sorted(t for t in writes if not self.may_call(role, t))


def env_roles(
    env: Environment, ownership: Ownership, domains: Mapping[str, Mapping[str, ParamDomain]]
) -> Roles:
    """The roles of `env` (see the module docstring); `domains` are its parameters' domains."""
    writes = sorted(name for name, spec in env.tools.items() if not spec.read_only)
    if ownership.table is None:
        return Roles(None, frozenset(writes), frozenset(), declared=False)
    role = singular(ownership.table).replace("_", " ")
    rules = load_policy_rules(env)
    identity = rules.declared.identity if rules is not None else None
    if identity is not None:
        staff = {t for t in writes if t in identity.exempt}
        declared = True
    else:
        staff = {t for t in writes if not any(map(ownership.names_owned, domains.get(t, {}).values()))}
        declared = False
    return Roles(role, frozenset(staff), frozenset(writes) - staff, declared=declared)
