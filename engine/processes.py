"""Child processes that stop with their parent: every server and job this project starts
(llama-server, a dashboard job) is tied to the process that started it, so none outlives
it (DEVELOPERS.md: servers stop with their parent)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent thread ends


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A preexec_fn asking the kernel to send the child `sig` when the thread that forked
    it ends (Linux); None elsewhere. The C function is looked up here, before the fork."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), sig)

    return preexec
