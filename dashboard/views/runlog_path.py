"""What is wrong with a run-log path before anything is read from it: a folder that does
not exist, or a file that is not there beside run logs that are (a misspelled name), so
that a mistyped path reads as a mistake, never as an empty run log."""

from __future__ import annotations

from pathlib import Path

SUFFIX = ".duckdb"


def path_problem(db: str, is_lake: bool = False) -> tuple[str, bool] | None:
    """(what is wrong, whether a new run log can still be made there) for a run-log path
    whose file is missing; None when the file is there, for a lake, and for a new file
    in a folder that holds no other run log (a first run makes it)."""
    if is_lake or not db:
        return None
    path = Path(db).expanduser()
    if path.is_file():
        return None
    if path.is_dir():
        return (f"{db} is a folder, not a run log: give a file in it, say "
                f"{path / ('runs' + SUFFIX)}", False)
    folder = path.parent
    if not folder.is_dir():
        return (f"No folder {folder}: check the run log's path (a run writes its log into "
                "an existing folder)", False)
    others = sorted(p.name for p in folder.glob(f"*{SUFFIX}") if p.is_file())
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3
                                         else "")
        return (f"No run log named {path.name} in {folder}, which holds {shown}: check the "
                "name (a run would start a new log under this one)", True)
    if path.suffix != SUFFIX:
        return (f"No file {path.name} in {folder}, and run logs end in {SUFFIX}: check the "
                "name (a run would start a new log under this one)", True)
    return None
