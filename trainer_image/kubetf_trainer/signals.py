"""SIGTERM must end the program even when it runs as PID 1 (a pod `command` replaces the image's init,
and PID 1 ignores signals that have no handler)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any

from . import fence, report

SIGTERM_EXIT_CODE = 128 + signal.SIGTERM  # 143: what a container killed by SIGTERM reports


def _exit(signum: int, frame: Any) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    report.flush(timeout=2.0, final=True)  # the last progress report: os._exit skips the exit-time one
    fence.release()  # os._exit skips the exit-time release too
    os._exit(128 + signum)


def exit_on_sigterm() -> bool:
    """Exit with 143 on SIGTERM, unless something else (e.g. PreemptionCheckpointHandler) already
    handles it. Only from the main thread; returns whether the handler was installed."""
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return False
        signal.signal(signal.SIGTERM, _exit)
        return True
    except ValueError:  # not the main thread
        return False


def reinstall_sigterm_handler() -> None:
    """Creating a MultiWorkerMirroredStrategy replaces the process's SIGTERM handler with TensorFlow's, which only
    notes the signal (std::signal in tsl's SigtermNotifier; see kubetf/sigterm.py), while Python still reports the
    old one. Put Python's handler back, so that SIGTERM keeps doing what this process asked for."""
    with contextlib.suppress(ValueError):  # not the main thread
        handler = signal.getsignal(signal.SIGTERM)
        if callable(handler):
            signal.signal(signal.SIGTERM, handler)
