"""Children a test can interrupt with Ctrl-C, however the test run itself was started.

A shell starts a background job (`make test &`, `nohup`, a CI step run in the background) with
SIGINT ignored, children inherit that, and Python started with SIGINT ignored installs no
KeyboardInterrupt handler: the CLI under test would then sleep through the SIGINT a test sends it
and finish its work instead, which reads as "Ctrl-C does not stop it". `interruptible` gives the
child the disposition a terminal gives a foreground command.
"""

from __future__ import annotations

import signal


def interruptible() -> None:
    """`preexec_fn` for a child that must take SIGINT as Ctrl-C (default disposition restored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
