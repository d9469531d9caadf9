"""Run settings: one dataclass, and everything else derived from it.

`RunConfig` is what a run is started with and what the run log stores. Each field that a
person can set carries, in its metadata, what a command-line flag needs (its name, help,
choices, how to read its text). From that one source come:

- the flags of `python -m engine run` (and the subset `experiment` takes): `add_run_flags`;
- the settings a parsed command line gives: `given_settings` (only the flags actually
  typed, so a fork stores every option it was given, defaults included);
- `engine.optimize`'s keyword defaults: `DEFAULTS`;
- the dashboard's New-run form, which turns its values back into flags: `as_flags`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit, urlunsplit


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, not {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {text}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, not {text}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {text}")
    return value


def parse_options(items: Iterable[str]) -> dict[str, Any]:
    """`--option KEY=VALUE` items: whole numbers become ints."""
    options: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--option expects KEY=VALUE, not {item!r}")
        key, value = item.split("=", 1)
        try:
            options[key] = int(value)
        except ValueError:
            options[key] = value
    return options


def parse_limits(items: Iterable[str]) -> dict[str, int]:
    """`--backend-limit BACKEND=N` items."""
    limits = {}
    for item in items:
        name, _, value = item.partition("=")
        if not name or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--backend-limit expects BACKEND=N with N a positive whole "
                             f"number, not {item!r}")
        limits[name] = int(value)
    return limits


def _backends() -> list[str]:
    from engine.llm.factory import BACKENDS

    return list(BACKENDS)


def _serving_modes() -> list[str]:
    from engine.llm.server import SERVING_MODES

    return list(SERVING_MODES)


def _methods() -> list[str]:
    from engine.methods import METHODS

    return sorted(METHODS)


def _contrast_methods() -> list[str]:
    from engine.core.graph import CONTRAST_METHODS

    return list(CONTRAST_METHODS)


def _prompt_sets() -> list[str]:
    from engine.prompts.sets import PROMPT_SETS

    return list(PROMPT_SETS)


def setting(default: Any = MISSING, *, help: str, flag: str | None = None,
            type: Callable[[str], Any] | None = None,
            choices: Iterable[str] | Callable[[], Iterable[str]] | None = None,
            negate: str | None = None, repeat: Callable[[list[str]], Any] | None = None,
            metavar: str | None = None, factory: Callable[[], Any] | None = None) -> Any:
    """A RunConfig field with what its command-line flag needs.

    `flag` defaults to the field name with dashes; `negate` names a store-false flag for a
    boolean that defaults to True (`--no-gate`); `repeat` makes the flag repeatable and turns
    its list of texts into the field's value."""
    meta = {"help": help, "flag": flag, "type": type, "choices": choices, "negate": negate,
            "repeat": repeat, "metavar": metavar}
    if factory is not None:
        return field(default_factory=factory, metadata={"cli": meta})
    return field(default=default, metadata={"cli": meta})


@dataclass
class RunConfig:
    """The settings of one run, as stored in the run log (`runs.config`)."""

    graph: str
    method: str = setting("semantic", choices=_methods,
                          help="credit-assignment method (docs/methods.md)")
    # The dataclass default is the offline backend; the command line and engine.optimize
    # resolve "no backend given" the same way, with engine.llm.factory.default_backend_kind.
    backend: str = setting("scripted", choices=_backends,
                           help="model backend (default: openai if OPENAI_API_KEY or "
                                "OPENAI_BASE_URL is set, else the embedded local model)")
    model: str | None = setting(None, help="model for forward calls; with --backend local, "
                                           "smollm2-135m, qwen2.5-coder-0.5b (the default), "
                                           "qwen2.5-coder-1.5b (python -m engine models lists "
                                           "them) or a GGUF file's path")
    chat_format: str | None = setting(None, metavar="NAME",
                                      help="with --backend local: the chat format "
                                           "(llama-cpp-python's names, e.g. chatml) of a GGUF "
                                           "file that has no chat template")
    local_serving: str = setting("auto", choices=_serving_modes,
                                 help="with --backend local: serve the model with llama.cpp's "
                                      "server (llama-server: calls decoded together, prompt "
                                      "prefixes reused) or in-process (llama-cpp-python); "
                                      "auto: the server when it is installed")
    optimizer_backend: str | None = setting(None, choices=_backends,
                                            help="backend for loss, backward and update calls "
                                                 "(default: --backend)")
    optimizer_model: str | None = setting(None, help="model for loss, backward and update calls")
    scripted_responder: str | None = setting(
        None, metavar="FILE.py:NAME",
        help="with --backend scripted: NAME() in FILE.py (or MODULE:NAME) returns the "
             "scripted model's responder (request -> reply, or None for the default "
             "reply), e.g. sample_graphs/demo_responder.py:demo_responder; forks, resumes "
             "and probes of the run use it too")
    steps: int = setting(4, type=non_negative_int,
                         help="optimization steps (0 only scores the starting prompts) "
                              "(default: the graph's `steps:`, else 4)")
    train: int | None = setting(None, type=non_negative_int,
                                help="training examples (default: graph's)")
    val: int | None = setting(None, type=non_negative_int,
                              help="validation examples (default: graph's)")
    test: int | None = setting(None, type=non_negative_int, help="test examples (default: graph's)")
    seed: int = setting(0, type=int,
                        help="seed of the splits, the sampled failures and the model")
    db: str = setting("runs.duckdb", help="the run log (a DuckDB file)")
    data_dir: str | None = setting(None, help="where named datasets live")
    dataset: str | None = setting(None, help="override the graph's dataset")
    cache: str = setting("readwrite", choices=("off", "read", "readwrite"),
                         help="reuse identical calls from the run log's cache")
    concurrency: int | None = setting(None, type=positive_int,
                                      help="the most calls in flight at once, across all "
                                           "backends (default: adaptive, from 64 up to 256, "
                                           "halved when the server pushes back)")
    backend_limits: dict[str, int] = setting(
        flag="--backend-limit", repeat=parse_limits, metavar="BACKEND=N", factory=dict,
        help="a lower limit for one backend, e.g. openai=4 (repeatable)")
    failures_per_step: int = setting(2, flag="--failures", type=positive_int,
                                     help="failing examples back-propagated per step (k)")
    gate: bool = setting(True, negate="--no-gate", help="accept every proposal (ablation)")
    update_mode: str = setting("all", choices=("all", "one"),
                               help="update every trainable prompt per step, or one at a time")
    update_when: str = setting("asked", choices=("asked", "always"),
                               help="asked: no update call for a prompt whose gradients all "
                                    "said it needs no change (their recorded claim); always: "
                                    "an update call for every trainable prompt, as the paper")
    node_gates: str = setting("off", choices=("auto", "on", "off"),
                              help="also score each changed prompt alone on validation (off: "
                                   "never, the probes answer it on demand; auto: after a "
                                   "rejected step that changed 2 to 4 prompts; on: every step)")
    proposals: int = setting(1, type=positive_int, metavar="N",
                             help="candidate prompt sets a step writes from the same "
                                  "gradients (the first greedy, the others sampled), each "
                                  "scored on validation: the best is kept if it improves "
                                  "(1: the paper's single proposal; a graph may set its own)")
    contrast: str | None = setting(None, choices=_contrast_methods, metavar="METHOD",
                                   help="with a sibling-aware method (semantic): also write "
                                        "METHOD's sibling-blind gradients (semantic-nosibling "
                                        "or textgrad) for the same back-propagated examples, "
                                        "from the same forward pass, at the nodes with two "
                                        "inputs or more; never used for an update: the Learn "
                                        "tour's 'Without siblings' shows both, no second run "
                                        "(default: the graph's `contrast:`)")
    temperature: float = setting(0.0, type=float,
                                 help="sampling temperature of every call (0: greedy)")
    max_tokens: int | None = setting(None, type=positive_int, help="forward generation limit")
    optimizer_max_tokens: int | None = setting(None, type=positive_int,
                                               help="generation limit of loss, backward and "
                                                    "update calls")
    base_url: str | None = setting(None, help="OpenAI-compatible server URL "
                                              "(default: OPENAI_BASE_URL)")
    timeout: float | None = setting(None, type=float,
                                    help="seconds per call (default: 120; on the embedded "
                                         "model 600, counted from when the model starts on it)")
    max_retries: int = setting(4, type=non_negative_int,
                               help="retries of a call that fails or times out")
    run_id: str | None = setting(None, help="name the run (default: generated)")
    method_options: dict[str, Any] = setting(
        flag="--option", repeat=parse_options, metavar="KEY=VALUE", factory=dict,
        help="method option, e.g. m0=2 for gtbp (repeatable)")
    prompts: str = setting("default", choices=_prompt_sets,
                           help="prompt set: ours, or the paper reference code's structure "
                                "(docs/methods.md)")
    structured: str = setting("auto", choices=("auto", "on", "off"),
                              help="JSON-schema replies for backward, update and gtbp calls "
                                   "(auto: where the backend supports them, text formats after "
                                   "a server refuses)")
    allow_copies: bool = setting(False, help="apply proposed prompts that copy training "
                                             "examples (few-shot style)")
    max_calls: int | None = setting(None, type=non_negative_int, metavar="N",
                                    help="stop before the model call (cache miss) that would "
                                         "exceed N")
    max_cost: float | None = setting(None, type=non_negative_float, metavar="USD",
                                     help="stop before the call that could take spending on "
                                          "priced models above USD")
    # Not a flag: where the graph's Python functions and metric come from
    # (engine/runs/code.py), recorded by execute(); later commands import them again from it.
    code: dict[str, Any] = field(default_factory=dict)
    # Not a flag: how a run recorded through the gateway (`trace --pipeline`) re-runs its
    # pipeline ({"pipeline": MODULE:FUNCTION or "command": CMD, "cwd", "concurrency",
    # "timeout"}); empty for every other run, whose forward passes call node by node (an
    # imported file's: its recorded calls replayed).
    rerun: dict[str, Any] = field(default_factory=dict)
    # Not a flag: an imported run's edges and how the importer found each ("FROM->TO":
    # "structure", "content" or "intervention"); empty for a graph's run
    edge_sources: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The config as stored in the run log: never an API key; a base URL loses any
        user:password part."""
        data = asdict(self)
        if data.get("base_url"):
            data["base_url"] = without_credentials(data["base_url"])
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunConfig:
        known = {f.name for f in fields(cls)}
        config = cls(**{k: v for k, v in data.items() if k in known})
        if config.backend == "local" and config.model is None:
            # a new run records the model it resolved; a logged local run without one is
            # older than the named models and ran the embedded model of its day, SmolLM2
            config.model = LEGACY_LOCAL_MODEL
        return config


LEGACY_LOCAL_MODEL = "smollm2-135m"


def forward_mode(config: Mapping[str, Any], graph_yaml: str = "") -> str:
    """How a logged run's later forward passes run, in words: a pipeline re-run through
    the gateway (`trace`, `optimize`), an imported file's recorded calls replayed, or the
    graph's own calls. The Runs page and `optimize` say it alike."""
    rerun = config.get("rerun") or {}
    if rerun:
        what = rerun.get("pipeline") or f"command {rerun.get('command')!r}"
        return f"re-runs its pipeline ({what}) through the gateway"
    if "recorded: true" in graph_yaml:
        return "replays its recorded calls"
    return "calls its graph's nodes"


def edge_sources_line(config: Mapping[str, Any]) -> str:
    """How an imported run's flows were found, in words ("" for a graph's run): the
    Graph page's caption, and `trace --json`'s edge_sources read as a sentence."""
    sources = config.get("edge_sources") or {}
    if not sources:
        return ""
    by_how: dict[str, list[str]] = {}
    for edge, how in sorted(sources.items()):
        by_how.setdefault(how, []).append(edge.replace("->", " → "))
    order = ("structure", "content", "intervention", "declaration")
    return "Flows found by " + "; by ".join(
        f"{how}: {', '.join(by_how[how])}" for how in sorted(
            by_how, key=lambda h: order.index(h) if h in order else len(order)))


def without_credentials(url: str) -> str:
    """`url` without any user:password part; scheme, host, port and path are kept."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]  # host[:port], IPv6 brackets included
    return urlunsplit(parts._replace(netloc=host))


DEFAULTS = RunConfig(graph="")
SETTINGS = tuple(f for f in fields(RunConfig) if "cli" in f.metadata)


def flag_of(name: str) -> str:
    """The command-line flag of a setting (`failures_per_step` -> `--failures`)."""
    meta = next(f for f in SETTINGS if f.name == name).metadata["cli"]
    return meta["negate"] or meta["flag"] or "--" + name.replace("_", "-")


def add_run_flags(parser: argparse.ArgumentParser, only: Iterable[str] | None = None,
                  skip: Iterable[str] = ()) -> None:
    """Add one flag per setting. A flag that is not typed leaves no attribute behind
    (`given_settings` tells typed from default); `only`/`skip` choose the settings."""
    wanted = set(only) if only is not None else None
    for f in SETTINGS:
        if (wanted is not None and f.name not in wanted) or f.name in skip:
            continue
        meta = f.metadata["cli"]
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                                  "help": meta["help"]}
        if meta["negate"]:
            parser.add_argument(meta["negate"], action="store_false", **kwargs)
            continue
        if isinstance(f.default, bool):
            parser.add_argument(flag_of(f.name), action="store_true", **kwargs)
            continue
        if meta["repeat"]:
            kwargs["action"] = "append"
        choices = meta["choices"]
        if callable(choices):
            choices = choices()
        if choices is not None:
            kwargs["choices"] = list(choices)
        if meta["type"] is not None:
            kwargs["type"] = meta["type"]
        if meta["metavar"]:
            kwargs["metavar"] = meta["metavar"]
        default = f.default if f.default is not MISSING else None
        if default not in (None, "") and not meta["repeat"]:
            kwargs["help"] += f" (default: {default})" if "(default" not in meta["help"] else ""
        parser.add_argument(flag_of(f.name), **kwargs)


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings typed on a command line parsed with `add_run_flags`, as RunConfig
    values (repeatable flags parsed). Raises ValueError for a malformed item."""
    given = {}
    for f in SETTINGS:
        if hasattr(args, f.name):
            value = getattr(args, f.name)
            repeat = f.metadata["cli"]["repeat"]
            given[f.name] = repeat(value) if repeat else value
    return given


def as_flags(settings: Mapping[str, Any]) -> list[str]:
    """Command-line flags for settings: the inverse of `given_settings` (a value equal to
    its default is still written, so the command says what was asked for)."""
    by_name = {f.name: f for f in SETTINGS}
    argv: list[str] = []
    for name, value in settings.items():
        if name not in by_name:
            raise ValueError(f"unknown run setting '{name}' (see engine.runs.settings.RunConfig)")
        meta = by_name[name].metadata["cli"]
        if meta["negate"]:
            argv += [] if value else [meta["negate"]]
        elif isinstance(by_name[name].default, bool):
            argv += [flag_of(name)] if value else []
        elif meta["repeat"]:
            for key, item in dict(value).items():
                argv += [flag_of(name), f"{key}={item}"]
        elif value not in (None, ""):
            argv += [flag_of(name), str(value)]
    return argv
