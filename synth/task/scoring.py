"""What the offline reward parts measure: required outputs found under an answer rule, and
checkpoints held by an end state. `rewards.py` turns them into part scores and composes them.

- outputs: every required output is communicated in the agent's messages, under the task's
  answer rule (below); the part counts only when all outputs were communicated;
- checkpoints: the fraction of write checkpoints whose rows hold their golden values.

Answer rules (`Task.answer_rule`; docs/scoring.md has the same text with examples):

`exact` (synthesized tasks). A required output is found only as a whole value, and only when the
agent did not state it among a spread of candidates:
- A required output that reads as a number (`5`, `1022.00`, `-3`, `$45.10`, `1,250`) is found when
  a number token in the messages has the same value. A number token is digits written in full,
  optionally with a leading `-`, a currency sign (`$ € £`), thousands separators (`,` every three
  digits, all or none) and a decimal part: `5`, `5.0`, `5.00`, `$5`, `1,250`, `1250.00`. It stands
  alone: no letter, digit or `_` touches it, and it is no part of an id, a date, a time, a range
  or a list written without spaces (`P-104`, `W123`, `2024-05-01`, `10:30`, `5-10`, `1,2,3` hold
  no number token). A unit after a space is fine (`5 dollars`, `5 loans`); `5%` counts as 5.
  Numbers in words (`five`) do not count: tool results show digits, and so must the answer.
- Any other required output is normalised (Unicode NFKC, case-folded, commas as spaces,
  whitespace collapsed, punctuation stripped from its two ends) and found where the messages,
  normalised the same way, hold it whole: no letter or digit touches either end, nor does a
  connector (`- . / @ : _`) followed by one, so `P-1045` and `P-104-2` do not state `P-104`.
- Several candidates earn nothing. Other values of the output's kind (numbers: integers and
  amounts as one pool; for an id-shaped string output, the ids of the same shape, `P-104` →
  `p-<digits>`) that the messages state beyond the required outputs and the task's known values
  (every number and id among the user's known facts and the golden calls' arguments) are *other
  candidates*. A required output is earned when a token states it and its other candidates are
  all values the agent was shown (the user's messages, and the results of the task's own calls
  less what each passed in: `shown_results`) and at most `MAX_OTHER_CANDIDATES` (2) of them,
  and only if the answer is one the agent worked out: when a shown text holds the answer, or
  it is one of the task's own values, no shown value may stand beside it (a read answer is
  stated alone: a copy of what showed it, or of any slice of it, names the answer among
  shown values without choosing one, and cannot be told from a report quoting them).
  The operands of an equation that holds ("81 + 14 + 6 = 101") are working, not candidates. So
  "Order #W123 total is $45.10, shipped to 12 Main St; you have 3 orders" earns both outputs
  when the total was summed from shown prices and a result showed 12 Main St, but not 45.10
  when the order's record showed it; and "It is 1, 2 or 3", every integer 0..999, a copied
  result, or a list of all product ids earns nothing.

`substring` (τ²-bench imports, by default: it is what τ² scores). τ-bench's rule: the required
output, lower-cased with commas removed, is a substring of the messages lower-cased with commas
removed. `envforge eval --answers strict` and `envforge score --answers strict` score such tasks
by the exact rule instead.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cached_property, lru_cache
from typing import Any, Literal

from envforge.server import State, is_frozen

from .models import AnswerRule, Checkpoint, Task
from .statediff import cents_row, json_key

#: How many other values of its kind a stated required output may stand among, each one a value
#: the agent was shown (see the docstring); a value it was not shown allows none.
MAX_OTHER_CANDIDATES = 2

#: What the agent was shown, or a function giving it: built only when an answer has other
#: candidates (most scored answers state the outputs alone, and each result costs a parse).
Shown = Sequence[str] | Callable[[], Sequence[str]]

#: `task`: each task's own `answer_rule`; `strict`: the exact rule for every task.
AnswersMode = Literal["task", "strict"]


def normalize_text(text: str) -> str:
    """τ-bench's normalisation, used by the substring rule and the LLM-rewrite fact check."""
    return text.lower().replace(",", "")


def outputs_missing_substring(required: Sequence[str], agent_messages: Sequence[str]) -> list[str]:
    said = normalize_text("\n".join(agent_messages))
    return [o for o in required if normalize_text(o) not in said]


# --------------------------------------------------------------------------- the exact rule

NUMBER_BODY = r"(?P<sign>-)?(?P<currency>[$€£])?(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<frac>\d+))?"
NUMBER_TOKEN = re.compile(
    r"(?<![\w.,\-/:])"  # not the tail of a word, a decimal, a list, an id, a date or a time
    + NUMBER_BODY
    + r"(?![\w]|[.,/:\-]\d)"  # not followed by more of a word or of a number
)
WHOLE_NUMBER = re.compile(NUMBER_BODY)
EDGE_PUNCTUATION = " \t\n.,;:!?\"'`()[]{}<>"
#: A string output's ends: no word character, nor a connector joined to one, next to either end.
LEFT_EDGE = r"(?<!\w)(?<!\w[-./@:_])"
RIGHT_EDGE = r"(?!\w)(?![-./@:_]\w)"
#: One token holding a digit and a letter (an id), or digits joined by `-`, `:` or `/` (a date, a
#: time): its shape defines its kind.
ID_SHAPED = re.compile(r"(?=\S*\d)(?=\S*[^\W\d_]|\S*\d[-:/]\d)\S+")


#: An operand of shown work: a number token without a sign (`81`, `$4,500.00`).
OPERAND = r"[$€£]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
#: Shown work: operands joined by + - * / × ÷, then `=` and a result ("81 + 14 + 6 = 101"); the
#: match ends before the result, which stays a stated number.
EQUATION = re.compile(
    rf"(?<![\w.,\-/:$€£]){OPERAND}(?:\s*[-+*/×÷]\s*{OPERAND})+\s*=\s*(?P<result>{OPERAND})(?![\w]|[.,/:\-]\d)"
)
_EQUATION_PART = re.compile(rf"(?P<operand>{OPERAND})|(?P<op>[-+*/×÷])")


def _evaluate(expression: str) -> Decimal | None:
    """`expression` (operands and operators as EQUATION matched them), * and / before + and -."""
    terms: list[Decimal] = []
    pending = "+"
    for part in _EQUATION_PART.finditer(expression):
        if part["op"]:
            pending = part["op"]
            continue
        value = _token_number(part["operand"]).value
        if pending in "+-":
            terms.append(value if pending == "+" else -value)
        elif pending in "*×":
            terms[-1] *= value
        elif value == 0:
            return None
        else:
            terms[-1] /= value
    return sum(terms, Decimal(0))


def without_shown_work(text: str) -> str:
    """`text` with the operands of every true equation blanked out: "81 + 14 + 6 = 101" states
    101 alone. Working shown that adds up is not a list of candidates; one that does not add up
    stays in, each of its numbers a candidate."""

    def blank(m: re.Match[str]) -> str:
        lhs = m.group()[: m.start("result") - m.start()].rstrip().removesuffix("=")
        try:
            value = _evaluate(lhs)
            result = _token_number(m["result"]).value
            holds = value is not None and abs(value - result) <= Decimal("0.005")
        except ArithmeticError:  # past Decimal's range ("1000…0 * 1000…0 * …"): no working that holds
            holds = False
        if not holds:
            return m.group()
        return " " * (m.start("result") - m.start()) + m["result"]

    return EQUATION.sub(blank, text) if "=" in text else text


@dataclass(frozen=True)
class StatedNumber:
    value: Decimal
    kind: Literal["integer", "amount"]


def _number(match: re.Match[str]) -> StatedNumber:
    text = match["int"].replace(",", "") + (f".{match['frac']}" if match["frac"] is not None else "")
    value = -Decimal(text) if match["sign"] else Decimal(text)
    amount = match["frac"] is not None or match["currency"] is not None
    return StatedNumber(value, "amount" if amount else "integer")


def number_tokens(text: str) -> list[StatedNumber]:
    """Every number token of `text` (the module docstring says what one is), in order."""
    return [_token_number(m.group()) for m in NUMBER_TOKEN.finditer(text)]


#: Lines per block that `stated_numbers` parses and caches as one.
LINES_PER_BLOCK = 128


def stated_numbers(text: str) -> dict[str, set[Decimal]]:
    """The values of `text`'s number tokens by kind: `number_tokens`, as sets, parsed in blocks of lines.

    A token holds no line break and its guards read a line break as they read either end of the
    text, so `text`'s tokens are its lines' tokens in order, and any run of whole lines can be
    parsed alone. Blocks of LINES_PER_BLOCK lines are cached: a spray message's first thousand
    lines, 0..999, are the same in every message, and they cost more to parse than all else a
    task's scoring does.
    """
    lines = text.split("\n")
    out: dict[str, set[Decimal]] = {}
    for start in range(0, len(lines), LINES_PER_BLOCK):
        for kind, values in _block_numbers("\n".join(lines[start : start + LINES_PER_BLOCK])):
            out.setdefault(kind, set()).update(values)
    return out


@lru_cache(maxsize=4096)
def _block_numbers(block: str) -> tuple[tuple[str, frozenset[Decimal]], ...]:
    by_kind: dict[str, set[Decimal]] = {}
    for n in number_tokens(block):
        by_kind.setdefault(n.kind, set()).add(n.value)
    return tuple((kind, frozenset(values)) for kind, values in by_kind.items())


@lru_cache(maxsize=65536)
def _token_number(token: str) -> StatedNumber:
    """A matched token's value (tokens repeat across messages: a spray states 0..999 every time)."""
    match = WHOLE_NUMBER.fullmatch(token)
    assert match is not None  # a NUMBER_TOKEN match is NUMBER_BODY between zero-width guards
    return _number(match)


@lru_cache(maxsize=65536)
def parse_number(text: str) -> StatedNumber | None:
    """`text` as one number token (a required output such as `5`, `1022.00` or `$1,250`), or None."""
    match = WHOLE_NUMBER.fullmatch(text.strip())
    if match is None:
        return None
    try:
        return _number(match)
    except InvalidOperation:
        return None


def normalize_words(text: str) -> str:
    """NFKC, case-folded, commas as spaces, whitespace runs collapsed to one space."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().replace(",", " ").split())


def _required_string(text: str) -> str:
    return normalize_words(text).strip(EDGE_PUNCTUATION)


def id_shape(text: str) -> str | None:
    """The regex of ids shaped like `text` (digit runs become `\\d+`), or None if it is no id."""
    if not ID_SHAPED.fullmatch(text):
        return None
    return "".join(r"\d+" if part[0].isdigit() else re.escape(part) for part in re.findall(r"\d+|\D", text))


def _whole(pattern: str) -> re.Pattern[str]:
    return _compiled(LEFT_EDGE + pattern + RIGHT_EDGE)


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


@dataclass(frozen=True)
class KnownValues:
    """What the task itself states (instruction, known facts): never counted as another candidate."""

    numbers: frozenset[Decimal]
    words: str


@lru_cache(maxsize=4096)
def known_values(text: str) -> KnownValues:
    return KnownValues(frozenset(n.value for n in number_tokens(text)), normalize_words(text))


def task_known_text(task: Task) -> str:
    """The values the task itself puts in play: the user's known facts and the golden calls'
    arguments (ids, quantities). Not the instruction's prose: its step numbers ("step 2") would
    hand a hedge free candidates."""
    facts = [f.value for f in task.scenario.known_facts]
    arguments = [c.arguments for c in task.golden_calls]
    return json.dumps([facts, arguments], ensure_ascii=False)


def shown_result(text: str, arguments: Any) -> str:
    """A tool result as shown to the agent: less the values of the call's own `arguments`.

    A value a result repeats from its call ("Error: class 1 2 3 not found") was the agent's before
    it was the tool's; counted as shown, one failing read would make any hedge's values "shown".
    Number tokens of an argument's value, and its id-shaped words, are blanked from the text."""
    said = json.dumps(arguments, ensure_ascii=False, default=str)
    numbers = {n.value for n in number_tokens(said)}
    if numbers:
        text = NUMBER_TOKEN.sub(
            lambda m: " " * len(m.group()) if _token_number(m.group()).value in numbers else m.group(), text
        )
    for word in {w.strip(EDGE_PUNCTUATION) for w in ID_SHAPED.findall(normalize_words(said))}:
        if word:
            text = _compiled("(?i)" + LEFT_EDGE + re.escape(word) + RIGHT_EDGE).sub(" ", text)
    return text


def shown_results(task: Task, results: Iterable[tuple[str, Mapping[str, Any], str]]) -> list[str]:
    """What an episode's tool results show the agent: of each (tool, arguments, result text), the
    result of a call the task itself makes (a golden call: the same tool, the same arguments),
    less what that call passed in (`shown_result`). Any other call's result shows nothing: a
    policy that lists every table before answering would otherwise have every small number
    "shown", and "1 or 2" beat the best single guess."""
    golden = {(c.name, json_key(c.arguments)) for c in task.golden_calls}
    return [
        shown_result(text, arguments)
        for name, arguments, text in results
        if (name, json_key(dict(arguments))) in golden
    ]


def _shown_values(messages: Sequence[str]) -> tuple[KnownValues, ...]:
    """The values in each text the agent was shown (a user message, a tool result), one entry a
    text: which values sat in the same text as an answer decides whether they may stand beside
    it (`_Said.alibis`). Uncached: each episode's are its own."""
    return tuple(
        KnownValues(frozenset(n.value for n in number_tokens(text)), normalize_words(text))
        for text in messages
    )


class _Said:
    """The agent's messages, parsed once for all of a task's required outputs.

    `known` gives the task's own values, `shown` the values in each text the agent was shown (the
    user's messages, the tool results); each is built only when a stated value has others."""

    def __init__(
        self,
        agent_messages: Sequence[str],
        required: Sequence[str],
        known: Callable[[], KnownValues],
        shown: Callable[[], tuple[KnownValues, ...]],
    ):
        text = self.text = "\n".join(agent_messages)
        self._known, self._shown = known, shown
        # every kind in one pool: "4.00" states the value 4 as much as "4" does
        self.numbers = set().union(*stated_numbers(without_shown_work(text)).values())
        parsed = [parse_number(r) for r in required]
        self.required_numbers = {p.value for p in parsed if p is not None}
        self.required_words = {
            _required_string(r) for r, p in zip(required, parsed, strict=True) if p is None
        }

    @cached_property
    def words(self) -> str:
        return normalize_words(self.text)

    @cached_property
    def known(self) -> KnownValues:
        return self._known()

    @cached_property
    def shown(self) -> tuple[KnownValues, ...]:
        return self._shown()

    @staticmethod
    def alibis(texts: Iterable[tuple[bool, set[Any]]], *, known: bool) -> set[Any]:
        """The shown values that may stand beside an answer, from each shown text (whether it
        holds the answer, its values of the answer's kind): all of them for an answer the agent
        worked out (no shown text holds it, and it is none of the task's own values, which each
        result is shown without), none for an answer it could have read. A read answer can be
        named by copying what showed it, and a copy of one result, a slice of it or every result
        states the answer among shown values without choosing one; the scorer cannot tell that
        copy from a report that quotes the same values, so a read answer is stated alone."""
        out: set[Any] = set()
        if known:
            return out
        for holds, values in texts:
            if holds:
                return set()
            out.update(values)
        return out

    def _few_others(
        self, others: set[Any], known: Callable[[], Iterable[Any]], alibis: Callable[[], set[Any]]
    ) -> bool:
        """Other values beyond the task's own: none that is no alibi (`alibis`), at most
        MAX_OTHER_CANDIDATES that are."""
        if not others:
            return True
        others = others.difference(known())
        return len(others) <= MAX_OTHER_CANDIDATES and not others.difference(alibis())

    def has_number(self, want: Decimal) -> bool:
        """Stated by a number token outside shown work, among few other values (`_few_others`)."""
        return want in self.numbers and self._few_others(
            self.numbers - self.required_numbers - {want},
            lambda: self.known.numbers,
            lambda: self.alibis(
                ((want in t.numbers, set(t.numbers)) for t in self.shown), known=want in self.known.numbers
            ),
        )

    def has_words(self, want: str) -> bool:
        if not want or _whole(re.escape(want)).search(self.words) is None:
            return False
        shape = id_shape(want)
        if shape is None:
            return True
        same_shape, itself = _whole(shape), _whole(re.escape(want))
        others = {m.group() for m in same_shape.finditer(self.words)} - self.required_words - {want}
        return self._few_others(
            others,
            lambda: {m.group() for m in same_shape.finditer(self.known.words)},
            lambda: self.alibis(
                (
                    (itself.search(t.words) is not None, {m.group() for m in same_shape.finditer(t.words)})
                    for t in self.shown
                ),
                known=itself.search(self.known.words) is not None,
            ),
        )


def outputs_missing_exact(
    required: Sequence[str],
    agent_messages: Sequence[str],
    known_text: str | Callable[[], str] = "",
    shown_messages: Shown = (),
) -> list[str]:
    """`known_text` (or a function returning it, called only if needed) holds the task's own
    values; `shown_messages` (or a function returning them, called only if needed) are what the
    agent was shown (the user's messages, tool results)."""
    if not required:
        return []
    said = _Said(
        agent_messages,
        required,
        lambda: known_values(known_text() if callable(known_text) else known_text),
        lambda: _shown_values(shown_messages() if callable(shown_messages) else shown_messages),
    )
    missing = []
    for r in required:
        number = parse_number(r)
        found = said.has_number(number.value) if number is not None else said.has_words(_required_string(r))
        if not found:
            missing.append(r)
    return missing


# --------------------------------------------------------------------------- rules per task


def outputs_missing(
    required: Sequence[str],
    agent_messages: Sequence[str],
    *,
    rule: AnswerRule = "exact",
    known_text: str | Callable[[], str] = "",
    shown_messages: Shown = (),
) -> list[str]:
    """The required outputs not communicated in the agent's messages under `rule`."""
    if rule == "substring":
        return outputs_missing_substring(required, agent_messages)
    return outputs_missing_exact(required, agent_messages, known_text, shown_messages)


def task_outputs_missing(task: Task, agent_messages: Sequence[str], shown_messages: Shown = ()) -> list[str]:
    """`task`'s required outputs not communicated, under the task's own answer rule."""
    if not task.required_outputs:
        return []
    return outputs_missing(
        task.required_outputs,
        agent_messages,
        rule=task.answer_rule,
        known_text=lambda: task_known_text(task),
        shown_messages=shown_messages,
    )


def with_answers(tasks: Iterable[Task], answers: AnswersMode) -> list[Task]:
    """`tasks` as `answers` scores them: unchanged under `task`, every one `exact` under `strict`.

    The rule travels inside each task, so every scorer (eval, `--resume`, re-scoring, `score`)
    applies the same one without a parameter of its own.
    """
    if answers == "task":
        return list(tasks)
    return [t if t.answer_rule == "exact" else t.model_copy(update={"answer_rule": "exact"}) for t in tasks]


# --------------------------------------------------------------------------- state and checkpoints


# Indexes of frozen tables (`server.freeze`: never changed again), by the identity of the row
# list and the key columns; each entry holds the list, so its id cannot be reused. An episode's
# unwritten tables are its starting state's frozen lists, so a checkpoint on a table the trial did
# not write looks its row up here instead of scanning thousands of rows every trial. None: a key
# column holds an unhashable value, so that table is scanned.
_INDEXES: dict[tuple[int, tuple[str, ...]], tuple[list[Any], dict[tuple[Any, ...], Any] | None]] = {}
_INDEXES_LIMIT = 256


def _frozen_index(rows: list[Any], cols: tuple[str, ...]) -> dict[tuple[Any, ...], Any] | None:
    """`rows`' first row per value tuple of `cols` (dict keys compare like `==`: 1 == 1.0 == True)."""
    hit = _INDEXES.get((id(rows), cols))
    if hit is not None and hit[0] is rows:
        return hit[1]
    index: dict[tuple[Any, ...], Any] | None = {}
    for r in rows:
        try:
            index.setdefault(tuple(r.get(c) for c in cols), r)  # type: ignore[union-attr]
        except (TypeError, AttributeError):  # an unhashable value, or a row that is no dict
            index = None
            break
    if len(_INDEXES) >= _INDEXES_LIMIT:
        _INDEXES.clear()
    _INDEXES[(id(rows), cols)] = (rows, index)
    return index


def _lookup(state: State, table: str, key: dict[str, Any]) -> dict[str, Any] | None:
    """The first row of `table` whose `key` columns hold `key`'s values.

    Values are compared as values: a frozen table (one the episode did not write) through an
    index made once per run (`_frozen_index`), any other by a scan with early exit (a checkpoint
    names a handful of rows, so indexing a table seen once would cost more than it saves).
    """
    rows = state.get(table, [])
    if type(rows) is list and is_frozen(rows) and all(v == v for v in key.values()):  # NaN: scan
        index = _frozen_index(rows, tuple(key))
        if index is not None:
            try:
                return index.get(tuple(key.values()))
            except TypeError:  # an unhashable wanted value: scanned below
                pass
    if len(key) == 1:
        ((col, want),) = key.items()
        return next((r for r in rows if r.get(col) == want), None)
    items = list(key.items())
    return next((r for r in rows if all(r.get(c) == v for c, v in items)), None)


def checkpoint_passed(checkpoint: Checkpoint, state: State) -> bool:
    for check in checkpoint.rows:
        found = _lookup(state, check.table, check.key)
        if check.row is None:
            if found is not None:
                return False
        elif found is None or cents_row(found) != cents_row(check.row):
            return False
    return True


def oracle_messages(task: Task) -> list[str]:
    """What a perfect agent says: every required output (the oracle agent's final message)."""
    return ["; ".join(task.required_outputs)] if task.required_outputs else []
