"""A setting out of its range, stated once and named in the caller's own terms.

The API checks its settings where they are used (a cap below 1, a timeout that is not positive, a
vLLM backend without its URL); a script reads the error with the parameter names it passed
(`max_episodes`), the CLI with the flags the user typed (`--max-episodes`). One rule, one
message: a front end renders the API's error with its own names instead of repeating the check.
"""

from __future__ import annotations

from collections.abc import Callable


class SettingError(ValueError):
    """A setting out of its range, stated once and named in the caller's own terms.

    `template` names each setting as `{name}`: `str()` shows the names as a script passed them
    (`max_episodes`), `render(name_of)` as another caller spells them (the CLI: its flags,
    `--max-episodes`), so a front end shows the API's rule instead of repeating it."""

    def __init__(self, template: str, *names: str) -> None:
        self.template = template
        self.names = names
        super().__init__(self.render(str))

    def render(self, name_of: Callable[[str], str]) -> str:
        """The message with each setting's name as `name_of` spells it."""
        return self.template.format_map({name: name_of(name) for name in self.names})
