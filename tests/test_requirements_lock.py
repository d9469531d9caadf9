"""requirements.txt pins every requirement, requirements.lock pins every package they pull in,
and the two agree; DuckDB is the release its extension packages are built for (a DuckDB
loads only extensions built for its own version). `./dev setup` installs with the lock as
pip's constraints and installs again when it changes. No network: the files are read, and
set-up runs on a stand-in Python."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.graphs import REPO

EXTENSIONS = ("duckdb-ext-ducklake", "duckdb-ext-postgres", "duckdb-ext-httpfs")


def requirement_lines(text: str) -> list[str]:
    return [ln.split("#", 1)[0].strip() for ln in text.splitlines()
            if ln.split("#", 1)[0].strip()]


def pins(text: str) -> dict[str, str]:
    """name -> the version a requirements file pins it to (None where it is not `==`)."""
    found = {}
    for line in requirement_lines(text):
        req = Requirement(line)
        specs = list(req.specifier)
        exact = specs[0].version if len(specs) == 1 and specs[0].operator == "==" else None
        found[canonicalize_name(req.name)] = exact
    return found


def problems(requirements: str, lock: str) -> list[str]:
    """What is wrong between requirements.txt and the lock, one line each."""
    wanted, locked = pins(requirements), pins(lock)
    out = [f"requirements.txt: {n} is not pinned with ==" for n, v in wanted.items() if v is None]
    out += [f"lock: {n} is not pinned with ==" for n, v in locked.items() if v is None]
    lock_names = [canonicalize_name(Requirement(ln).name) for ln in requirement_lines(lock)]
    out += [f"lock: {n} appears twice" for n in sorted(set(lock_names))
            if lock_names.count(n) > 1]
    for name, version in wanted.items():
        if name not in locked:
            out.append(f"{name} is in requirements.txt but not in the lock")
        elif version is not None and locked[name] != version:
            out.append(f"{name}: requirements.txt pins {version}, the lock {locked[name]}")
    duckdb = wanted.get("duckdb")
    for ext in EXTENSIONS:
        built_for = ".".join((wanted.get(ext) or "").split(".")[:3])
        if built_for != duckdb:
            out.append(f"{ext} {wanted.get(ext)} is built for DuckDB {built_for or '?'}, "
                       f"requirements.txt pins duckdb {duckdb}")
    return out


REQUIREMENTS = (REPO / "requirements.txt").read_text(encoding="utf-8")
LOCK = (REPO / "requirements.lock").read_text(encoding="utf-8")


def test_every_requirement_is_pinned_and_the_lock_agrees():
    assert problems(REQUIREMENTS, LOCK) == []


def test_duckdb_is_the_release_its_extension_packages_are_built_for():
    wanted = pins(REQUIREMENTS)
    assert set(EXTENSIONS) <= set(wanted)
    assert {".".join(wanted[ext].split(".")[:3]) for ext in EXTENSIONS} == {wanted["duckdb"]}


def test_the_lock_holds_packages_only():
    for line in requirement_lines(LOCK):
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!-]+", line), line
    assert "semback" not in pins(LOCK)  # the project itself is installed apart, editable


def test_a_changed_pin_or_a_duckdb_of_another_release_is_caught():
    moved = REQUIREMENTS.replace("\nstreamlit==", "\nstreamlit==0.0.1\n#")
    assert any(p.startswith("streamlit: requirements.txt pins 0.0.1") for p in
               problems(moved, LOCK))
    newer = re.sub(r"(?m)^duckdb==.*$", "duckdb==2.0.1", REQUIREMENTS)
    stale = problems(newer, LOCK.replace("\nduckdb==", "\nduckdb==2.0.1\n#"))
    assert len(stale) == len(EXTENSIONS)
    assert all("is built for DuckDB 1.4.4, requirements.txt pins duckdb 2.0.1" in p
               for p in stale)
    loose = REQUIREMENTS.replace("\npyyaml==", "\npyyaml>=")
    assert problems(loose, LOCK) == ["requirements.txt: pyyaml is not pinned with =="]
    assert problems(REQUIREMENTS, LOCK + "duckdb==1.4.4\n") == ["lock: duckdb appears twice"]


# --- ./dev setup installs with the lock ---------------------------------------------------

STUB_PYTHON = """#!/bin/sh
echo "$*" >> "$LOG"
case "$*" in
  *"import llama_cpp"*) exit 1 ;;
  *importlib.metadata*) echo 0.3.36 ;;
esac
exit 0
"""


def setup_run(repo: Path, tmp_path: Path) -> list[str]:
    """The pip commands of `./dev setup` in `repo`, on a stand-in Python, with a browser, a
    PostgreSQL and an already built llama-server standing in."""
    bin_dir, log = tmp_path / "bin", tmp_path / "commands.log"
    bin_dir.mkdir(exist_ok=True)
    pg = tmp_path / "pg"
    pg.mkdir(exist_ok=True)
    for name in ("initdb", "pg_ctl"):
        (pg / name).write_text("#!/bin/sh\n")
        (pg / name).chmod(0o755)
    (bin_dir / "pg_config").write_text(f"#!/bin/sh\necho {pg}\n")
    (bin_dir / "pg_config").chmod(0o755)
    (tmp_path / "chromium").write_text("#!/bin/sh\n")
    (tmp_path / "chromium").chmod(0o755)
    log.unlink(missing_ok=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log), "HOME": str(tmp_path),
           "SEMBACK_CHROMIUM": str(tmp_path / "chromium"), "SEMBACK_CPU_FLAGS": "avx2",
           "SEMBACK_POSTGRES_LIB": str(tmp_path / "no-postgresql")}
    done = subprocess.run(["bash", str(repo / "dev"), "setup"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return [c for c in log.read_text().splitlines() if c.startswith("-m pip install")]


def test_setup_installs_with_the_lock_and_again_when_it_changes(tmp_path):
    repo = tmp_path / "repo"
    venv = repo / ".venv"
    (venv / "bin").mkdir(parents=True)
    for name in ("dev", "requirements.txt", "pyproject.toml", "requirements.lock"):
        (repo / name).write_bytes((REPO / name).read_bytes())
    (repo / "dev").chmod(0o755)
    (venv / "bin" / "python").write_text(STUB_PYTHON)
    (venv / "bin" / "python").chmod(0o755)
    (venv / "bin" / "llama-server").write_text("#!/bin/sh\n")
    (venv / "bin" / "llama-server").chmod(0o755)
    (venv / ".llama-server.version").write_text("0.3.36 avx2 avx2\n")

    pip, llama, everything, project = setup_run(repo, tmp_path)
    assert pip.endswith("--upgrade pip -c requirements.lock")
    assert llama.endswith("-c requirements.lock llama-cpp-python==0.3.36")
    assert everything == "-m pip install --quiet -r requirements.txt -c requirements.lock"
    assert project == "-m pip install --quiet --no-deps -e ."
    assert setup_run(repo, tmp_path) == []  # stamped: nothing changed, nothing installed
    with (repo / "requirements.lock").open("a") as fh:
        fh.write("# regenerated\n")
    assert len(setup_run(repo, tmp_path)) == 4
