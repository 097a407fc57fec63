"""What each signal means to a tunnelgate process: one table per process role.

A signal with no meaning for the proxy must not end it: the kernel's default action for
SIGUSR1, SIGUSR2 or SIGALRM is to terminate, silently, so a stray ``kill -USR1`` (a log
rotator, a misdirected reload script) would take a replica down without a line in the
log. Such signals are caught and ignored, and the first of each kind is logged at info.
SIGPIPE needs no entry: the interpreter ignores it from start-up (a write to a closed
socket is an ``EPIPE`` error on that socket instead).

A role's table maps a signal to an action name; the caller of :func:`install` supplies
a handler for every action but ``ignore``. Adding a signal is one table entry plus its
handler.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Callable, Mapping

log = logging.getLogger("tunnelgate.signals")

IGNORE = "ignore"
STOP = "stop"  # drain, then exit; a second one exits at once
RELOAD = "reload"  # re-read the --config file

SignalTable = Mapping[signal.Signals, str]
Handler = Callable[[signal.Signals], None]

# `tunnelgate serve` (a single process, or the supervisor of --workers N).
SERVE_SIGNALS: SignalTable = {
    signal.SIGTERM: STOP,
    signal.SIGINT: STOP,
    signal.SIGHUP: RELOAD,
    signal.SIGUSR1: IGNORE,
    signal.SIGUSR2: IGNORE,
    signal.SIGALRM: IGNORE,
}

# A worker of --workers N. Not SIGINT: Ctrl-C in a terminal reaches the whole process
# group, the supervisor handles it and forwards the drain, so a worker keeps it ignored
# at the OS level from its first instruction on (proxy.control.workerprocess). SIGHUP:
# the supervisor re-reads the file and pushes; a worker has nothing to re-read.
WORKER_SIGNALS: SignalTable = {
    **{signum: action for signum, action in SERVE_SIGNALS.items()
       if signum != signal.SIGINT},
    signal.SIGHUP: IGNORE,
}


def install(loop: asyncio.AbstractEventLoop, table: SignalTable,
            handlers: Mapping[str, Handler]) -> None:
    """Route every signal of ``table`` to the handler of its action on ``loop``.

    Raises KeyError if an action other than ``ignore`` has no handler (a table entry
    nobody implemented must fail at start-up, not when the signal arrives).
    """
    ignored: set[signal.Signals] = set()

    def ignore(signum: signal.Signals) -> None:
        if signum not in ignored:  # once per signal: a flood must not flood the log
            ignored.add(signum)
            log.info("signal ignored: it has no meaning for tunnelgate",
                     extra={"signal": signum.name})

    for signum, action in table.items():
        handler = ignore if action == IGNORE else handlers[action]
        loop.add_signal_handler(signum, handler, signum)
