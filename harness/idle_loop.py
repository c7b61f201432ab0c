"""A conversation that goes nowhere, and the one rule that ends it.

An exchange (the agent's turn and the user's reply to it) is *idle* when neither side called a
tool and each side's message either only thanks, closes or refuses ("You're welcome!", "Is there
anything else I can help you with?", "No, that's all.", "Sorry, I can't help with that."), or
says again, word for word and asking nothing, what that side said the exchange before ("All
done. 4" / "4"). After `IDLE_EXCHANGES` idle exchanges in a row the harness ends the trial
(`Termination.IDLE_LOOP`).

Small model users seldom say the stop token: with the oracle agent, Qwen2.5-Coder-0.5B as the
user echoed "All done." back until the turn limit in 8 of 9 conversations
(docs/benchmarks/local-models.md, the local-model user), and a local agent with a local user
traded "You're welcome!" for 30 turns. Ended at the limit, each such trial was `max_turns`:
the agent's failure, reward 0, on tasks whose end state was right.

Who is charged: neither side. An idle exchange calls no tool, so the end state is the one the
loop started from, and the trial is scored on it exactly as if the user had said `###STOP###`
at the loop's first exchange (status `completed`, fault `none`): an agent that had done the
task keeps its reward, one that had not (refusals traded back and forth) earns what its state
earns, 0. The alternatives charge the loop to one side for what both did: `max_turns` charges the
agent for a user that would not hang up, and an infrastructure failure would re-run a
measurement that is repeatable. An agent that keeps talking without acting is still the agent's
failure wherever it says something new (a question, a fact, a plan): only pleasantries and
repeats count, and an agent that says nothing at all is the silence rule's (`users.says_nothing`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

IDLE_EXCHANGES = 3
"""Idle exchanges in a row that end a trial: two are a polite goodbye ("Thanks!" / "You're
welcome! Anything else?", "No, that's all." / "Have a great day!"), a third goes nowhere."""

CLOSING_WORDS = frozenset(
    """
    a again all alright also always am an and any anything anyway apologies apologize appreciate
    appreciated are as assist assistance assisting at awesome be bit but bye can can't cannot
    cant care certainly cheers could day definitely did do don't done dont else enjoy evening
    everything excellent feel fine for free further glad goes good goodbye got great had happy
    has have help helped helpful helping here hope i i'm i've if im in is it it's its just know
    let like lot me more much my need nice night no not nothing now of oh ok okay on one other
    our out perfect pleasure problem question questions reach really regret request see set so
    sorry sure take thank thanks that that's thats the then there this to today too unable
    unfortunately us very want was we welcome well what will with wonderful would yes you you're
    your youre
    """.split()
)
"""Words that thank, close or refuse, and nothing else: a message of only these says nothing new.
No verb of an action ("cancel", "book", "proceed") and no noun of a domain is among them, so a
request, a question for a fact or a consent request is never idle; any digit makes a message
carry a value."""

_CONTROL = re.compile(r"#{2,}\s*[A-Z]+\s*#{2,}")
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def _normal(text: str) -> str:
    """`text` as compared with the same side's previous message: no control token, one case,
    the words alone."""
    return " ".join(_WORD.findall(_CONTROL.sub(" ", text).replace("\u2019", "'").lower()))


def only_closing(text: str) -> bool:
    """Whether `text` only thanks, closes or refuses (`CLOSING_WORDS`): some words, all of them
    closing ones, and no digit."""
    plain = _CONTROL.sub(" ", text).replace("\u2019", "'").lower()
    if any(c.isdigit() for c in plain):
        return False
    words = _WORD.findall(plain)
    return bool(words) and all(w in CLOSING_WORDS for w in words)


@dataclass
class IdleLoop:
    """Counts idle exchanges in a row; `see` each finished exchange, in order."""

    exchanges: int = 0
    _agent: str | None = None
    _user: str | None = None

    def _idle(self, text: str, previous: str | None) -> bool:
        """Closing words only, or the side's previous message again, asking nothing: a question
        asked again is a side still wanting something (an agent that asks forever is its own
        failure, at the turn limit)."""
        now = _normal(text)
        return only_closing(text) or (bool(now) and now == previous and "?" not in text)

    def see(self, agent_text: str, called_tools: bool, user_text: str) -> bool:
        """Note one exchange: the agent's last message of its turn (`agent_text`), whether it
        called a tool in that turn, and the user's reply. True when the loop has gone on for
        `IDLE_EXCHANGES` exchanges: the conversation should end."""
        idle = (
            not called_tools
            and bool(agent_text.strip())
            and self._idle(agent_text, self._agent)
            and self._idle(user_text, self._user)
        )
        self._agent, self._user = _normal(agent_text), _normal(user_text)
        self.exchanges = self.exchanges + 1 if idle else 0
        return self.exchanges >= IDLE_EXCHANGES
