"""Whether a model's rewording of a task's request keeps the task: the judge of `synth tasks --llm`.

The templated scenario is the task's meaning; a rewrite (`wording.render.rewrite_scenario`) only
rewords its request lines, and ships only when this judge finds nothing it changes. Each problem
is `"<class>: <detail>"`, the class one of:

- **drops**: a value the templated request says is gone (an id, a date, a number, a figure of an
  address, a quoted text, a value said in words such as a reason "defective"), or a known fact
  or an answer is no longer in the instruction. Captured: asked to reword "swap, in order O-5060,
  item OI-6106 for variant V-4013", Qwen2.5-Coder-1.5B wrote "swap O-5060 for V-4013".
- **invents**: a figure or id the templated scenario never says (a second order, a made-up
  amount), or a name it never gives (the user calling themselves by another name).
- **tells the answer**: the request now holds a value the agent must find and tell the user.
- **principal**: the rewrite is no longer the user speaking of their own: not in the first or
  second person at all, first-person while it still says "your orders" (the template's
  second person, which said to the agent means the agent's orders), or speaking of a third
  person's ("my husband's order", "her profile", "another customer's orders"). Captured: Qwen2.5-Coder-0.5B
  wrote "I want to return, from the order … among your orders, …".
- **reverses**: a comparison turned round ("more than" become "less than", "highest" become
  "cheapest"), or the request negated ("I don't want to cancel").
- **units**: a figure kept with another unit ("5 days" become "5 weeks").
- **case**: a value said in other letter case ("Cedar Lane" become "cedar lane", "O-5008" become
  "o-5008"): the agent writes what the user says, and the end state holds the template's case.
- **adds**: an action the template never asks for ("also delete my account", "remove" for "add":
  the agent would carry it out), or words about the agent's own rules ("skip the identity check",
  "ignore your policy") or an authority the user has not ("I'm the store manager").
- **realism**: a realism measure (`realism.py`) the template is clear of and the rewrite is not:
  a tool's name or description, numbered steps, stiff wording.

Values are compared as said (`spoken_text`: commas and underscores do not count; case only through
**case**, for a value that holds a capital), and
figures as tokens: "2 days" reworded "two days" drops "2". That is strict on purpose: a rejected
rewrite costs only the template's wording, a kept wrong one a task whose user asks for something
its verifier does not check.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..task.models import ANSWERS_LINE, KNOWN_FACTS_LINE, CallNode, Task, UserScenario
from ..wording.render import missing_facts, request_lines, request_values, spoken_text
from .realism import has_numbered_steps, stiff_wording, tool_descriptions_in, tool_names_in

# A figure or an id: a token holding a digit ("O-5004", "2024-02-11", "12.50", "55401").
_FIGURE = re.compile(r"[A-Za-z0-9$][\w./:@$-]*")
_QUOTED = re.compile(r'"([^"\n]{2,})"')
# A capitalised word that does not start a sentence: a name, if the scenario never says it.
_MID_CAPITAL = re.compile(r"(?<=[a-z0-9,;:)] )[A-Z][a-z]+(?:[A-Z][a-z]+)*\b")
_FIRST = re.compile(r"\b(?:I|I'm|I'd|I've|I'll|me|my|mine|myself)\b")
_SECOND_OR_FIRST = re.compile(r"(?i)\b(?:i|i'm|i'd|i've|i'll|me|my|mine|myself|you|your|yours|yourself)\b")
_YOUR = re.compile(r"(?i)\byour (\w+)")
# (words one way, words the other way): a rewrite may not say the other way where the template did not
_OPPOSITES = (
    (("more than", "over", "above", "greater than", "higher than", "exceeds", "at least"),
     ("less than", "under", "below", "fewer than", "lower than", "at most")),
    (("highest", "most expensive", "largest", "biggest", "greatest", "maximum", "most"),
     ("lowest", "cheapest", "least", "smallest", "fewest", "minimum")),
)  # fmt: skip


# a figure and the unit after it ("5 days", "12 kg", "30%")
_MEASURE = re.compile(r"(?i)(?<![\w.])(\d[\d.,]*)(?:\s*-?\s*)(%|[a-z]+)")
_UNITS = frozenset(
    "second minute hour day night week month year dollar cent euro pound percent % kg kilogram gram "
    "lb mile km kilometer meter item unit piece seat ticket passenger bag guest room".split()
)
_NEGATIONS = ("not", "don't", "do not", "doesn't", "never", "no longer", "won't")
# a third person's things: "my husband's order", "her profile"
_THIRD_PERSON = re.compile(
    r"(?i)\b(?:(?:my|our) \w+'s|someone else's|he|she|his|her|hers|him|herself|himself"
    r"|(?:an)?other customers?|all customers|every customer|everyone's)\b"
)
# verbs that change something, beside the env's own tools' verbs; reading ones never count
_ACTIONS = frozenset(
    "add book buy cancel change close create delete disable downgrade enable exchange freeze "
    "modify open purchase refund remove rent replace reset resume return revoke sell suspend swap "
    "transfer update upgrade withdraw".split()
)
_NOT_ACTIONS = frozenset(
    "get list find search check calculate quote show view request place issue fill send".split()
)
_RULE_WORDS = (
    "skip", "ignore", "bypass", "override", "policy", "policies", "rules", "instructions",
    "without verifying", "without verification", "without checking", "without confirming",
    "no need to verify", "no need to check", "don't verify", "don't check", "don't ask",
    # authority the user does not have: the agent's rules do not bend for it
    "admin", "administrator", "manager", "supervisor", "staff", "employee", "authorize",
    "authorized", "authorise", "authorised",
)  # fmt: skip


def _measures(text: str) -> dict[str, set[str]]:
    """figure -> the units said right after it ("days" counted as "day")."""
    out: dict[str, set[str]] = {}
    for figure, unit in _MEASURE.findall(text):
        unit = unit.lower()
        unit = unit[:-1] if unit.endswith("s") and unit[:-1] in _UNITS else unit
        if unit in _UNITS:
            out.setdefault(figure.rstrip(".,"), set()).add(unit)
    return out


def _units(template: str, rewrite: str) -> list[str]:
    before, after = _measures(template), _measures(rewrite)
    return [
        f"units: {figure} {unit}"
        for figure, units in sorted(after.items())
        for unit in sorted(units - before.get(figure, units))
    ] + [
        f"units: {figure} {unit} is no longer said"
        for figure, units in sorted(before.items())
        if figure.lower() in _figures(rewrite)  # else the figure itself is dropped
        for unit in sorted(units - after.get(figure, set()))
    ]


def _case(values: list[str], rewrite: str) -> list[str]:
    """Values holding a capital that the rewrite says only in other letter case."""
    kept = " ".join(rewrite.replace(",", " ").replace("_", " ").split())
    out = []
    for value in dict.fromkeys(values):
        exact = " ".join(value.replace(",", " ").replace("_", " ").split())
        if exact.lower() != exact and exact.lower() in kept.lower() and exact not in kept:
            out.append(f"case: {value}")
    return out


def _said_verb(text: str, verb: str) -> bool:
    forms = [verb, verb + "s", verb + "es", verb + "d", verb + "ed", verb + "ing", verb[:-1] + "ing"]
    forms += [verb + verb[-1] + "ed", verb + verb[-1] + "ing"]
    return any(_has(text, f) for f in forms)


def _adds(template: str, rewrite: str, tools: Mapping[str, str]) -> list[str]:
    verbs = (_ACTIONS | {name.split("_")[0].lower() for name in tools}) - _NOT_ACTIONS
    out = [
        f"adds: asks to {v}" for v in sorted(verbs) if _said_verb(rewrite, v) and not _said_verb(template, v)
    ]
    out += [
        f"adds: says {w!r} of the agent's rules"
        for w in _RULE_WORDS
        if _has(rewrite, w) and not _has(template, w)
    ]
    return out


def _negated(template: str, rewrite: str) -> list[str]:
    said = rewrite.replace("\u2019", "'")
    return [f"reverses: says {w!r}" for w in _NEGATIONS if _has(said, w) and not _has(template, w)]


def _figures(text: str) -> set[str]:
    out = set()
    for token in _FIGURE.findall(text):
        token = token.rstrip(".,:;/-").lstrip("$").lower()
        if any(c.isdigit() for c in token):
            out.add(token)
    return out


def _has(text: str, phrase: str) -> bool:
    return re.search(rf"(?i)(?<!\w){re.escape(phrase)}(?!\w)", text) is not None


def _reversed(template: str, rewrite: str) -> list[str]:
    out = []
    for one, other in _OPPOSITES:
        for said, opposite in ((one, other), (other, one)):
            if any(_has(template, w) for w in said):
                turned = [w for w in opposite if _has(rewrite, w) and not _has(template, w)]
                out += [f"reverses: says {w!r}" for w in turned]
    return out


def _principal(template: str, rewrite: str) -> list[str]:
    if not _SECOND_OR_FIRST.search(rewrite):
        return ["principal: the request is not in the user's voice (no I, my, you or your)"]
    if not _FIRST.search(rewrite):
        return []  # still the template's second person: the harness says it as the user
    theirs = {m.group(0).lower() for m in _YOUR.finditer(template)}
    kept = sorted({m.group(0).lower() for m in _YOUR.finditer(rewrite)} & theirs)
    out = [f"principal: says {k!r} of the user's own in a first-person request" for k in kept]
    others = {m.group(0).lower() for m in _THIRD_PERSON.finditer(rewrite) if not _has(template, m.group(0))}
    return out + [f"principal: speaks of a third person's ({w!r})" for w in sorted(others)]


def _realism(task: Task, rewritten: Task, tools: Mapping[str, str]) -> list[str]:
    def measures(t: Task) -> set[str]:
        text = t.scenario.instruction
        found = {f"names tool {n}" for n in tool_names_in(text, tools)}
        found |= {f"copies the description of {n}" for n in tool_descriptions_in(text, tools)}
        found |= {"numbered steps"} if has_numbered_steps(text) else set()
        return found | {f"stiff: {why}" for why in stiff_wording(t)}

    return [f"realism: {m}" for m in sorted(measures(rewritten) - measures(task))]


def _names(task: Task) -> set[str]:
    """The env's own words for columns and parameters ("last4", "line1"): a digit in them makes no
    figure ("whose last four is 2119" keeps the task)."""
    out: set[str] = set()
    for node in task.dag.nodes:
        if isinstance(node, CallNode):
            out |= {p.lower() for p in node.call.arguments}
        else:
            out |= {n.lower() for n in (node.field, node.select, *node.path) if n}
    return out


def rewrite_problems(task: Task, rewritten: UserScenario, tools: Mapping[str, str]) -> list[str]:
    """Why `rewritten` does not say what `task.scenario` says (the module docstring's classes);
    [] when it keeps the task. `tools` maps the env's tool names to their descriptions."""
    template = task.scenario
    before = "\n".join(request_lines(template.instruction))
    after = "\n".join(request_lines(rewritten.instruction))
    kept = (KNOWN_FACTS_LINE, ANSWERS_LINE)
    problems: list[str] = []
    if [ln for ln in rewritten.instruction.splitlines() if ln.startswith(kept)] != [
        ln for ln in template.instruction.splitlines() if ln.startswith(kept)
    ]:
        problems.append("drops: the known facts or the answers line as written")
    names = _names(task)
    said = spoken_text(after)
    # figures as whole tokens ("6" is not kept by "V-641"); words as said, within the text
    dropped = {f: f for f in sorted(_figures(before) - names - _figures(after))}
    words = [*missing_facts(template, rewritten.instruction), *_QUOTED.findall(before)]
    words += request_values(task.dag, before)
    dropped |= {spoken_text(v): v for v in words if spoken_text(v) not in said and v.lower() not in dropped}
    problems += [f"drops: {v}" for v in dropped.values()]
    answers = {a for v in template.must_be_told for a in (_figures(v) or {v.lower()})}
    known = _figures(before) | _figures(template.persona) | names
    for fact in template.known_facts:
        known |= _figures(str(fact.value))
    for figure in sorted(_figures(after) - known):
        problems.append(f"{'tells the answer' if figure in answers else 'invents'}: {figure}")
    leaked = {
        a
        for a in answers
        if not any(c.isdigit() for c in a) and a in after.lower() and a not in before.lower()
    }
    problems += [f"tells the answer: {a}" for a in sorted(leaked)]
    source = " ".join([template.instruction, template.persona])
    new_names = {w for w in _MID_CAPITAL.findall(after) if not _has(source, w)}
    problems += [f"invents: the name {w}" for w in sorted(new_names)]
    problems += _principal(before, after)
    problems += _reversed(before, after) + _negated(before, after)
    problems += _units(before, after)
    capitals = [*words, *(t for t in _FIGURE.findall(before) if any(c.isdigit() for c in t))]
    problems += _case([v for v in capitals if spoken_text(v) in said], after)
    problems += _adds(before, after, tools)
    problems += _realism(task, task.model_copy(update={"scenario": rewritten}), tools)
    return problems


def problem_class(problem: str) -> str:
    """ "drops: O-5004" -> "drops": what a report counts rejections by."""
    return problem.split(":", 1)[0]
