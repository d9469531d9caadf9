"""Background runs: each is a `python -m engine run ...` subprocess with its own log file.

Streamlit must not run the engine in its own threads, so the dashboard starts a process,
watches the run log it writes (steps appear one transaction at a time) and its log
file, and stops it with SIGTERM (the engine then marks the run 'stopped'). A small JSON
record per job, kept next to its log, lets a reloaded page or a restarted server find
the jobs again.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.processes import die_with_parent
from engine.runlog import lake
from engine.runs.settings import DEFAULTS, as_flags

ROOT = Path(__file__).resolve().parents[1]
DEMO_GRAPH = ROOT / "sample_graphs" / "demo.yaml"
# the demo's measured hand-fixed prompts (benchmarks/demo_prompts.py)
DEMO_FIXED_PROMPTS = ROOT / "sample_graphs" / "data" / "demo_fixed_prompts.yaml"
# One step on the graph's own splits (8 train, 24 validation, 8 test) on the embedded pair
# (0.5B forward, 1.5B optimizer), two candidate prompt sets: 126 to 147 s on two cores from
# the command line with llama-server built for AVX-512, 133 to 164 s with the portable
# build, measured 2026-12-05 (benchmarks/results/2026-12-demo.md). DEMO_DURATION is that range
# as every page words it.
DEMO_DURATION = "two to three minutes on two cores"
# $SEMBACK_DEMO_BACKEND picks another backend for the demo buttons (the Runs page's demo,
# the Learn tour's paired run): `scripted` makes them instant, e.g. in the browser tests.
DEMO_OPTIONS = {"backend": os.environ.get("SEMBACK_DEMO_BACKEND") or "local", "steps": 1}
_PROCESSES: dict[int, subprocess.Popen] = {}  # children of this server, to reap them


@dataclass
class RunSpec:
    """What the New run form asks for. Its fields are run settings
    (`engine.runs.settings.RunConfig`) with the same defaults; `settings` takes any other
    setting by name, and `extra` raw flags."""

    graph: str
    db: str
    method: str = DEFAULTS.method
    backend: str = DEFAULTS.backend
    model: str | None = DEFAULTS.model
    optimizer_model: str | None = DEFAULTS.optimizer_model
    steps: int = DEFAULTS.steps
    train: int | None = DEFAULTS.train
    val: int | None = DEFAULTS.val
    test: int | None = DEFAULTS.test
    seed: int = DEFAULTS.seed
    dataset: str | None = DEFAULTS.dataset
    run_id: str | None = DEFAULTS.run_id
    settings: dict[str, Any] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)

    def run_settings(self) -> dict[str, Any]:
        chosen = {k: v for k, v in asdict(self).items() if k not in ("graph", "settings", "extra")}
        return {**chosen, **self.settings}


@dataclass
class Job:
    run_id: str
    db: str
    pid: int
    log: str
    command: list[str]
    started_at: float
    steps: int
    returncode: int | None = None
    stopped: bool = False
    ended_at: float | None = None  # when the process ended (its log's last write)
    kind: str = "run"  # run | fork (a run too) | probe | blame | compare | collect | import

    @property
    def seconds(self) -> float:
        return (self.ended_at or time.time()) - self.started_at

    @property
    def record(self) -> Path:
        return Path(self.log).with_suffix(".json")

    @property
    def progress_file(self) -> Path:
        """Where the engine writes this run's progress events (runs and forks)."""
        return Path(self.log).with_suffix(".progress.jsonl")


def absolute(db: str | Path) -> str:
    """The run log's address as a process started elsewhere (cwd ROOT) reads it: a file's
    absolute path; a lake's URL as it is, a file catalog's path made absolute
    (`ducklake:/abs/team.ducklake`)."""
    if not lake.is_lake(db):
        return str(Path(db).resolve())
    rest = lake.catalog(str(db))
    if lake.is_postgres(str(db)) or not rest.strip():
        return str(db)
    kind = "duckdb:" if rest.startswith("duckdb:") else ""
    return f"{lake.PREFIX}{kind}{Path(rest[len(kind):]).resolve()}"


def child_env(**extra: str) -> dict[str, str]:
    """A started process's environment: this one's (PGPASSWORD, ~/.pgpass through HOME and
    $SEMBACK_DATA_PATH reach it, so it opens the same lake), the project on its path, a
    relative $SEMBACK_DATA_PATH made absolute (the process runs in ROOT)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    where = env.get(lake.DATA_PATH_ENV, "").strip()
    if where and "://" not in where and not Path(where).is_absolute():
        env[lake.DATA_PATH_ENV] = str(Path(where).resolve())
    return env


def jobs_dir(db: str | Path) -> Path:
    """Where the jobs of one run log keep their logs (outside the working tree)."""
    base = Path(os.environ.get("SEMBACK_JOBS_DIR") or Path(tempfile.gettempdir()) / "semback-jobs")
    digest = hashlib.sha256(absolute(db).encode()).hexdigest()[:12]
    folder = base / digest
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def build_command(spec: RunSpec) -> list[str]:
    """The engine command line for a spec (run id included): the same flags a person types."""
    return [sys.executable, "-m", "engine", "run", str(spec.graph),
            *as_flags(spec.run_settings()), *spec.extra]


def estimate(spec: RunSpec, timeout: float = 120.0) -> tuple[bool, list[str]]:
    """What the run would cost, before Start: `python -m engine run ... --dry-run` with the
    spec's own flags (no model call, no run log). (True, its lines: the breakdown by phase
    and the one-line estimate) or (False, the engine's error line)."""
    cmd = build_command(RunSpec(**{**asdict(spec), "db": absolute(spec.db),
                                   "run_id": None})) + ["--dry-run"]
    env = child_env(COLUMNS="200")
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired:
        return False, [f"error: the estimate took longer than {timeout:g} s"]
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    if done.returncode != 0:
        return False, [in_form_terms(ln) for ln in
                       [ln for ln in lines if ln.startswith("error:")][-1:] or lines[-1:]]
    return True, [ln for ln in lines if not ln.startswith("dry run:")]


# the command line's words for what the New-run form calls by its fields' names
FORM_TERMS = (("(--data-dir or $SEMBACK_DATA_DIR)", "(the form's Data directory field)"),
              ("pass --data-dir", "fill in the Data directory field"))


def in_form_terms(line: str) -> str:
    """An engine error line as the New-run form's user reads it: flags named by the
    form's fields."""
    for flag, name in FORM_TERMS:
        line = line.replace(flag, name)
    return line


def start(spec: RunSpec) -> Job:
    """Validate the graph, then start the run in a new process group. Raises
    engine.core.graph.GraphError for a bad graph file."""
    from engine.core.graph import load_graph
    from engine.runs.execute import new_run_id

    graph = load_graph(spec.graph)
    spec.run_id = spec.run_id or new_run_id(graph.name, spec.method)
    spec.db = absolute(spec.db)
    return launch(build_command(spec), spec.run_id, spec.db, spec.steps, spec.run_id)


def launch(cmd: list[str], run_id: str, db: str, steps: int, name: str, kind: str = "run",
           with_dashboard: bool = False) -> Job:
    """Start `cmd` in a new process group, its output in `<name>.log` in the jobs folder.
    `with_dashboard`: the process ends when this dashboard's process does (a run outlives
    it, and a restarted dashboard finds it again; a service such as the trace receiver
    does not)."""
    log_path = jobs_dir(db) / f"{name}.log"
    if kind in ("run", "fork"):  # the run's progress as typed events, for the live view
        cmd = [*cmd, "--progress-file", str(log_path.with_suffix(".progress.jsonl"))]
    env = child_env()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        options = dict(cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        proc = _spawn_tied(cmd, options) if with_dashboard else \
            subprocess.Popen(cmd, **options)
    _PROCESSES[proc.pid] = proc
    job = Job(run_id, db, proc.pid, str(log_path), cmd, time.time(), steps, kind=kind)
    _save(job)
    return job


_TIED: list[subprocess.Popen] = []  # processes that end with this one


def _spawn_tied(cmd: list[str], options: dict[str, Any]) -> subprocess.Popen:
    """Popen(cmd) for a child that gets SIGTERM when this process ends: from the kernel on
    Linux (PR_SET_PDEATHSIG, even when this process is killed), else at exit. The kernel's
    signal follows the thread that forks, and Streamlit's script threads end after every
    rerun: the child is forked on a thread of its own that waits for it."""
    made: queue.Queue = queue.Queue()

    def keep() -> None:
        try:
            proc = subprocess.Popen(cmd, preexec_fn=_die_with_parent(), **options)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            made.put(exc)
            return
        made.put(proc)
        proc.wait()

    threading.Thread(target=keep, name="job-keeper", daemon=True).start()
    proc = made.get()
    if isinstance(proc, BaseException):
        raise proc
    _TIED.append(proc)
    return proc


def _die_with_parent() -> Any:
    """A preexec_fn asking the kernel for SIGTERM when the forking thread ends (Linux)."""
    return die_with_parent(signal.SIGTERM)


@atexit.register
def _stop_tied() -> None:
    for proc in _TIED:
        if proc.poll() is None:
            proc.terminate()


def _save(job: Job) -> None:
    job.record.write_text(json.dumps(asdict(job)), encoding="utf-8")


def list_jobs(db: str | Path, kinds: tuple[str, ...] = ("run", "fork")) -> list[Job]:
    """Jobs of these kinds started for this run log, newest first, with their exit codes
    refreshed (probes and blame are listed only when asked for)."""
    jobs = []
    for record in jobs_dir(db).glob("*.json"):
        job = load(record)
        if job is not None and job.kind in kinds:
            jobs.append(job)
    return sorted(jobs, key=lambda j: j.started_at, reverse=True)


def find(db: str | Path, run_id: str) -> Job | None:
    return next((j for j in list_jobs(db) if j.run_id == run_id), None)


def poll(job: Job) -> bool:
    """True while the job's process runs; records its exit code once it has ended."""
    if job.returncode is not None:
        return False
    proc = _PROCESSES.get(job.pid)
    if proc is not None:
        code = proc.poll()
        if code is None:
            return True
        _PROCESSES.pop(job.pid, None)
    elif _alive(job.pid):
        return True
    else:
        code = -1  # ended while no one of this process watched it: exit code unknown
    job.returncode, job.ended_at = code, ended_at(job)
    _save(job)
    return False


def ended_at(job: Job) -> float:
    """When the job's process ended: its log's last write (the engine writes its last
    line as it exits), not when a page happened to poll, which may be minutes later."""
    try:
        written = Path(job.log).stat().st_mtime
    except OSError:
        return time.time()
    return min(max(written, job.started_at), time.time())


def load(record: str | Path) -> Job | None:
    """The job saved in this record file (see Job.record), its exit code refreshed;
    None when the record is gone or unreadable."""
    try:
        job = Job(**json.loads(Path(record).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    poll(job)
    return job


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return True


def stop(job: Job) -> None:
    """Ask the engine to stop (SIGTERM): it finishes no further step and marks the run
    'stopped' in the run log."""
    if poll(job):
        try:
            os.kill(job.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        job.stopped = True
        _save(job)


def wait(job: Job, timeout: float) -> bool:
    """Wait up to `timeout` seconds for the job to end; True when it has."""
    deadline = time.monotonic() + timeout
    while poll(job):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def log_tail(job: Job, lines: int = 15) -> str:
    try:
        text = Path(job.log).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    # rich redraws its progress bar with carriage returns: keep the last state of a line
    rows = [row.rsplit("\r", 1)[-1] for row in text.splitlines()]
    return "\n".join(rows[-lines:])


def error_line(job: Job) -> str | None:
    """The engine's `error:` line in an ended job's log (a bad model name, a graph that does
    not load), in the New-run form's terms; None when the log holds none."""
    lines = [ln for ln in log_tail(job, 40).splitlines() if ln.startswith("error:")]
    return in_form_terms(lines[-1]) if lines else None


def forget(job: Job) -> None:
    """Remove a finished job's record and log."""
    if not poll(job):
        for path in (job.record, Path(job.log)):
            path.unlink(missing_ok=True)


# --- probes, blame and forks: the engine writes the run log, never the page ---


@dataclass
class ProbeSpec:
    """One counterfactual probe, as `python -m engine probe` takes it.

    kind 'output': replace the node's output on the example with `text`; 'gradient':
    follow the gradient the node received; 'edit': apply the step's proposed prompt
    (`text` None) or the prompt `text` to the node alone, on `examples`."""

    run_id: str
    db: str
    step: int
    node: str
    kind: str
    example: str | None = None
    text: str | None = None
    examples: str | None = None  # failing | val | ID,ID (edit probes)


def _text_file(db: str, name: str, text: str) -> Path:
    """A file beside the job logs holding a text the engine reads with @FILE."""
    path = jobs_dir(db) / f"{name}.txt"
    path.write_text(text, encoding="utf-8")
    return path


def job_name(kind: str, *parts: object) -> str:
    """A new job's name: its kind and a digest of what it is for and when it started."""
    digest = hashlib.sha256(repr((parts, time.time())).encode()).hexdigest()[:10]
    return f"{kind}-{digest}"


def probe_command(spec: ProbeSpec, text_file: Path | None = None) -> list[str]:
    """The pinned command line: `python -m engine probe RUN_ID --db DB --step S --node N
    (--example E --output @FILE | --example E --gradient | --edit proposed|@FILE
    [--examples ...]) --json`."""
    cmd = [sys.executable, "-m", "engine", "probe", spec.run_id, "--db", str(spec.db),
           "--step", str(spec.step), "--node", spec.node]
    if spec.kind in ("output", "gradient"):
        cmd += ["--example", str(spec.example)]
    if spec.kind == "output":
        cmd += ["--output", f"@{text_file}"]
    elif spec.kind == "gradient":
        cmd += ["--gradient"]
    elif spec.kind == "edit":
        cmd += ["--edit", f"@{text_file}" if text_file else "proposed"]
        if spec.examples:
            cmd += ["--examples", spec.examples]
        elif spec.example:
            cmd += ["--examples", spec.example]
    else:
        raise ValueError(f"unknown probe kind {spec.kind!r}")
    return cmd + ["--json"]


def start_probe(spec: ProbeSpec) -> Job:
    """Start a probe in the background; its rows land in the `probes` table."""
    spec.db = absolute(spec.db)
    name = job_name("probe", spec.run_id, spec.step, spec.node, spec.example, spec.kind)
    needs_file = spec.kind == "output" or (spec.kind == "edit" and spec.text is not None)
    text_file = _text_file(spec.db, name, spec.text or "") if needs_file else None
    return launch(probe_command(spec, text_file), spec.run_id, spec.db, 0, name, "probe")


def blame_command(run_id: str, db: str, step: int, examples: str | None = None) -> list[str]:
    """`python -m engine blame RUN_ID --db DB --step S [--examples failing|val]`."""
    cmd = [sys.executable, "-m", "engine", "blame", run_id, "--db", str(db), "--step",
           str(step)]
    return cmd + (["--examples", examples] if examples else [])


def start_blame(run_id: str, db: str, step: int, examples: str | None = None) -> Job:
    """Follow the gradient at every LLM node for every failing example of the step."""
    db = absolute(db)
    return launch(blame_command(run_id, db, step, examples), run_id, db, 0,
                  job_name("blame", run_id, step), "blame")


@dataclass
class ForkSpec:
    """A new run from the state of `run_id` after `step`, with hand-edited prompts."""

    run_id: str
    db: str
    step: int
    prompts: dict[str, str] = field(default_factory=dict)  # node -> prompt text
    steps: int = 1
    new_run_id: str | None = None
    extra: list[str] = field(default_factory=list)


def fork_command(spec: ForkSpec, prompt_files: dict[str, Path]) -> list[str]:
    """`python -m engine run --fork RUN_ID --from-step S [--set-prompt NODE=@FILE ...]
    --db DB --steps N [--run-id NEW]`."""
    cmd = [sys.executable, "-m", "engine", "run", "--fork", spec.run_id, "--from-step",
           str(spec.step), "--db", str(spec.db), "--steps", str(spec.steps)]
    for node, path in prompt_files.items():
        cmd += ["--set-prompt", f"{node}=@{path}"]
    if spec.new_run_id:
        cmd += ["--run-id", spec.new_run_id]
    return cmd + list(spec.extra)


def start_fork(spec: ForkSpec, graph_name: str = "fork", method: str = "semantic") -> Job:
    """Start the fork in the background; it shows on the Runs page like any run."""
    from engine.runs.execute import new_run_id

    spec.db = absolute(spec.db)
    spec.new_run_id = spec.new_run_id or new_run_id(graph_name, method)
    files = {node: _text_file(spec.db, f"{spec.new_run_id}-{node}", text)
             for node, text in spec.prompts.items()}
    return launch(fork_command(spec, files), spec.new_run_id, spec.db, spec.steps,
                  spec.new_run_id, "fork")


def probe_jobs(db: str | Path, run_id: str) -> list[Job]:
    """Probe and blame jobs started for a run, newest first."""
    return [j for j in list_jobs(db, kinds=("probe", "blame")) if j.run_id == run_id]


COMPARE_METHODS = ("semantic", "textgrad", "semantic-nosibling")


def compare_command(run_id: str, db: str, step: int) -> list[str]:
    """`python -m engine blame RUN_ID --db DB --step S --method M1,M2,.. --json`: each
    method's backward pass re-run on the same traces, its gradients followed."""
    return [*blame_command(run_id, db, step), "--method", ",".join(COMPARE_METHODS), "--json"]


def start_compare(run_id: str, db: str, step: int) -> Job:
    """Compare the methods' gradients on the step's failing examples, in the background."""
    db = absolute(db)
    return launch(compare_command(run_id, db, step), run_id, db, 0,
                  job_name("compare", run_id, step), "compare")


def compare_jobs(db: str | Path, run_id: str, step: int) -> list[Job]:
    """Method-comparison jobs of a run's step, newest first."""
    return [j for j in list_jobs(db, kinds=("compare",))
            if j.run_id == run_id and "--step" in j.command
            and j.command[j.command.index("--step") + 1] == str(int(step))]


def job_report(job: Job) -> dict | None:
    """The JSON object a finished `--json` job printed (its log holds it), or None."""
    try:
        text = Path(job.log).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if ch == "{" and (i == 0 or text[i - 1] == "\n")):
        try:
            found, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return None
