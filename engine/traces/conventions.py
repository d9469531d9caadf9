"""The facts the importer reads traces by, as data: OpenInference's and OpenTelemetry
GenAI's attribute names, and one `FrameworkProfile` per framework whose spans it knows.

A new framework is a new entry of PROFILES: the span names that are its own machinery
(never the name of a user's unit), the span name that names a unit by its signature, the
marker after which its system message holds the user's instructions, the fields a unit
returns that are never its value, and the adapter whose repeated calls are one call.
engine/traces/infer.py reads only what is derived here (docs/traces.md lists the
profiles)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# OpenInference (github.com/Arize-ai/openinference, semantic conventions)
SPAN_KIND = "openinference.span.kind"
INPUT_VALUE = "input.value"
OUTPUT_VALUE = "output.value"
INPUT_MESSAGES = "llm.input_messages"
OUTPUT_MESSAGES = "llm.output_messages"
MODEL_NAME = "llm.model_name"
INVOCATION_PARAMETERS = "llm.invocation_parameters"
PROMPT_TEMPLATE = "llm.prompt_template.template"
PROMPT_VARIABLES = "llm.prompt_template.variables"
# OpenTelemetry's GenAI conventions, read where OpenInference's are absent
GENAI_OPERATION = "gen_ai.operation.name"
UNIT_KINDS = ("CHAIN", "AGENT", "")  # span kinds a unit may have ("" when unrecorded)


@dataclass(frozen=True)
class FrameworkProfile:
    name: str
    # span names (regular expressions, whole name) of the framework's own machinery
    generic_names: tuple[str, ...] = ()
    # a span name whose group 1 names the unit (DSPy's `Predict(NoteSentence).forward`)
    unit_name: str | None = None
    # a span name of the framework's machinery whose group 1 is the name the user's code
    # gave the step (LangChain's `RunnableAssign<city>`: the `assign` key)
    unit_key: str | None = None
    # (marker, indent): the user's instructions follow the marker in the system message,
    # each line indented so
    prompt_markers: tuple[tuple[str, str], ...] = ()
    # fields a unit returns that are never the node's value (DSPy's chain of thought)
    ignored_fields: tuple[str, ...] = ()
    # an adapter span: a unit whose calls each sit under one, right below it, asked again
    # through another adapter, and is one node (DSPy's ChatAdapter -> JSONAdapter)
    retry_adapter: str | None = None


PROFILES = (
    FrameworkProfile(
        "langchain",
        generic_names=(r"Runnable\w*(?:<.*>)?", r"\w*PromptTemplate", r"\w*OutputParser",
                       r"Chat\w+"),
        unit_key=r"Runnable(?:Assign|Parallel)<(\w+)>"),
    FrameworkProfile(
        "dspy",
        generic_names=(r"\w*Adapter\.(?:__call__|acall)", r"\w*LM\.(?:__call__|acall)",
                       r"Module\.(?:__call__|acall)",
                       r"(?:Predict|ChainOfThought|ReAct|ProgramOfThought|BestOfN|Refine)"
                       r"(?:\(StringSignature\))?\.(?:forward|aforward)"),
        unit_name=r"\w+\((\w+)\)\.a?forward",
        prompt_markers=(("In adhering to this structure, your objective is: ", " " * 8),),
        ignored_fields=("reasoning",),
        retry_adapter=r"\w*Adapter\.(?:__call__|acall)"),
    FrameworkProfile(
        "openai",  # the instrumentors of the openai SDK and of LiteLLM, and GenAI's names
        generic_names=(r"ChatCompletion", r"Completion", r"completion", r"acompletion",
                       r"chat", r"Response")),
)


def _whole(patterns: list[str]) -> re.Pattern[str]:
    return re.compile("^(?:" + "|".join(patterns) + ")$") if patterns else re.compile("$^")


GENERIC_NAMES = _whole([n for p in PROFILES for n in p.generic_names])
UNIT_NAMES = tuple(re.compile(f"^{p.unit_name}$") for p in PROFILES if p.unit_name)
UNIT_KEYS = tuple(re.compile(f"^{p.unit_key}$") for p in PROFILES if p.unit_key)
PROMPT_MARKERS = tuple(m for p in PROFILES for m in p.prompt_markers)
IGNORED_FIELDS = frozenset(f for p in PROFILES for f in p.ignored_fields)
RETRY_ADAPTERS = _whole([p.retry_adapter for p in PROFILES if p.retry_adapter])


def key_name(span_name: str) -> str | None:
    """The name the user's code gave a framework's step (an `assign` key), or None."""
    return _named(UNIT_KEYS, span_name)


def signature_name(span_name: str) -> str | None:
    """The unit a span name names by its signature, or None."""
    return _named(UNIT_NAMES, span_name)


def _named(patterns: tuple[re.Pattern[str], ...], span_name: str) -> str | None:
    """Group 1 of the first pattern that matches the whole span name, or None."""
    for pattern in patterns:
        found = pattern.match(span_name)
        if found:
            return found[1]
    return None
