"""Tiny stand-ins for a model's part packages: installed wheels' layout (a module folder
with data/partNN.bin and a dist-info with METADATA and RECORD) in a folder put on
sys.path, so that importlib.metadata finds them as it finds the real ones."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from engine.llm.models import ModelSpec

VERSION = "0.9.0"
STEM = "fake-model-part"


def install_part(site: Path, index: int, data: bytes, version: str = VERSION) -> None:
    """Write part `index` (1-based) of the fake model into `site`, as pip would."""
    module = f"fake_model_part{index}"
    (site / module / "data").mkdir(parents=True, exist_ok=True)
    (site / module / "__init__.py").write_text("raise ImportError('never imported')\n")
    (site / module / "data" / f"part{index:02d}.bin").write_bytes(data)
    info = site / f"{module}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {STEM}{index}\n"
                                   f"Version: {version}\n")
    (info / "RECORD").write_text(f"{module}/__init__.py,,\n"
                                 f"{module}/data/part{index:02d}.bin,,\n"
                                 f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


def uninstall_part(site: Path, index: int) -> None:
    module = f"fake_model_part{index}"
    shutil.rmtree(site / module)
    for info in site.glob(f"{module}-*.dist-info"):
        shutil.rmtree(info)


def fake_model(site: Path, slices: list[bytes], name: str = "tiny-model") -> ModelSpec:
    """Install the slices as part packages in `site` and return the model's registry entry,
    its size and SHA-256 those of the slices joined in order."""
    for i, data in enumerate(slices, start=1):
        install_part(site, i, data)
    joined = b"".join(slices)
    return ModelSpec(name, "a tiny test model", "Apache-2.0", f"{name}.gguf",
                     tuple(f"{STEM}{i}" for i in range(1, len(slices) + 1)), version=VERSION,
                     size=len(joined), sha256=hashlib.sha256(joined).hexdigest())
