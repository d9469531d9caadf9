"""The selected run's panel on the Runs page: its test score, notes and tags (stored in
the run log through engine.runlog.writer.set_notes, the dashboard's one write), and
export as JSON, Parquet (a zip of one file per table) or OpenTelemetry JSON lines.

Its pure parts, computed from run-log rows and testable without Streamlit; the
Streamlit pieces that draw it (and start its jobs) are dashboard/widgets/run_panel.py."""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from engine.runlog import export, otel

FORMATS = {  # label -> (exporter, file suffix, MIME type)
    "JSON": (export.export_json, ".json", "application/json"),
    "Parquet (zip)": (export.export_parquet, "_parquet.zip", "application/zip"),
    "OpenTelemetry (JSON lines)": (otel.export_otel, ".otel.jsonl", "application/x-ndjson"),
}



def export_bytes(db: str, run_id: str, label: str) -> bytes:
    """The run exported in one format, as bytes (Parquet's folder zipped)."""
    exporter = FORMATS[label][0]
    with tempfile.TemporaryDirectory() as tmp:
        out = exporter(db, run_id, Path(tmp) / "export")
        if out.is_file():
            return out.read_bytes()
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in sorted(out.iterdir()):
                archive.write(file, file.name)
        return buffer.getvalue()



def file_stem(run_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)



def deferred_export(db: str, run_id: str, label: str) -> Callable[[], bytes]:
    return lambda: export_bytes(db, run_id, label)



def tags_of(record: dict) -> list[str]:
    try:
        tags = json.loads(record.get("tags") or "[]")
    except (TypeError, ValueError):
        return []
    return [str(t) for t in tags] if isinstance(tags, list) else []



COST_LABELS = {"step": "step", "phase": "phase", "model_calls": "model calls",
               "tokens": "tokens", "provider_cached_tokens": "of which provider-cached",
               "cost_usd": "cost (USD)", "cache_hits": "cache hits (free)",
               "cache_hit_tokens": "cache-hit tokens (free)"}
