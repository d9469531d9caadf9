"""A DSPy program of three predictors, traced with OpenInference's DSPy instrumentor, for
`python -m engine import-traces` (docs/traces.md).

The demo's task (sample_graphs/demo.yaml) written as a DSPy program: each example is a
sentence and a question about it ("Lena packed 7 boxes for the trip.", "How many boxes?");
the program answers the number the sentence gives (7):

- `note_sentence` (Predict(NoteSentence)) reads the sentence and should give the number it
  states, but its instructions (the signature's docstring) are plainly at fault: they ask
  for one word about the sentence;
- `name_thing` (Predict(NameThing)) reads the question and names what it counts (boxes);
- `answer` (ChainOfThought(AnswerCount)) reads both outputs, never the sentence, and gives
  the number it is handed.

Only `note_sentence` reads the sentence, so only an edit of its instructions can repair the
program: blame has one right answer, and the last stage needs no arithmetic, which the
embedded 0.5B model does badly.

Every call goes through DSPy's default ChatAdapter to `dspy.LM("openai/MODEL")` at
--base-url, uncached, at temperature 0; nothing else is contacted (LiteLLM reads its
bundled model cost map, DSPy's disk and memory caches are off). Run it against any
OpenAI-compatible server on 127.0.0.1 (the embedded model served by llama.cpp, or the
scripted server of the tests):

    python sample_graphs/dspy_pipeline.py --base-url http://127.0.0.1:8080/v1 \\
        --model qwen --out traces.jsonl --limit 12

It writes the spans as OTLP JSON lines (one ExportTraceServiceRequest a line, the
OpenTelemetry Collector's file format) to --out, and each example's expected number to
--targets (default: targets.jsonl beside --out), keyed by the root span's input.value. With
OTEL_EXPORTER_OTLP_ENDPOINT set and no --out, the spans go to that OTLP/HTTP endpoint
instead.
"""

from __future__ import annotations

import os

# before LiteLLM is imported (through dspy): its model cost map is read from the package,
# never fetched
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("DSP_CACHEBOOL", "false")

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import dspy  # noqa: E402
from openinference.instrumentation import safe_json_dumps  # noqa: E402
from openinference.instrumentation.dspy import DSPyInstrumentor  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # the exporter beside this script
from otlp_export import command_line, tracer_provider  # noqa: E402

DATA = Path(__file__).parent / "data" / "demo_counts.jsonl"  # the demo's examples


class NoteSentence(dspy.Signature):
    """Describe the mood of the sentence in one word."""
    # the planted fault: it should give the number the sentence states

    sentence: str = dspy.InputField()
    note: str = dspy.OutputField()


class NameThing(dspy.Signature):
    """Name the kind of thing the question asks about, in one word."""

    question: str = dspy.InputField()
    thing: str = dspy.OutputField()


class AnswerCount(dspy.Signature):
    """Copy the number from your inputs."""

    thing: str = dspy.InputField()
    note: str = dspy.InputField()
    number: str = dspy.OutputField()


SIGNATURES = {"note": NoteSentence, "thing": NameThing, "answer": AnswerCount}


def renamed(signature: type[dspy.Signature], like: type[dspy.Signature]
            ) -> type[dspy.Signature]:
    """`signature` under `like`'s class name, so its spans keep their names
    (Predict(NoteSentence).forward) when only the instructions change."""
    signature.__name__, signature.__qualname__ = like.__name__, like.__qualname__
    return signature


class CountPipeline(dspy.Module):
    """note reads the sentence, thing the question; answer reads their outputs."""

    def __init__(self, instructions: dict[str, str] | None = None) -> None:
        super().__init__()
        sigs = {name: renamed(sig.with_instructions(instructions[name]), sig)
                if instructions and name in instructions else sig
                for name, sig in SIGNATURES.items()}
        self.note = dspy.Predict(sigs["note"])
        self.thing = dspy.Predict(sigs["thing"])
        self.answer = dspy.ChainOfThought(sigs["answer"])

    def forward(self, sentence: str, question: str) -> dspy.Prediction:
        note = self.note(sentence=sentence).note
        thing = self.thing(question=question).thing
        return self.answer(thing=thing, note=note)


def root_input(sentence: str, question: str) -> str:
    """The root span's input.value as the DSPy instrumentor records it: the module's
    keyword arguments as JSON."""
    return safe_json_dumps({"sentence": sentence, "question": question})


def run(base_url: str, model: str, out: str | Path | None, limit: int, targets: str | Path,
        instructions: dict[str, str] | None = None) -> list[str]:
    """Run the program on the first `limit` examples, tracing every call to `out`;
    `instructions` replaces predictors' instructions by name (note, thing, answer)."""
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    provider = tracer_provider(out, "dspy_pipeline")
    DSPyInstrumentor().instrument(tracer_provider=provider)
    lm = dspy.LM(f"openai/{model}", api_base=base_url, api_key="not-needed", cache=False,
                 temperature=0, max_tokens=256)
    program = CountPipeline(instructions)
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()][:limit]
    answers = []
    try:
        with dspy.context(lm=lm, adapter=dspy.ChatAdapter()), \
                open(targets, "w", encoding="utf-8") as fh:
            for row in rows:
                got = program(sentence=row["text"], question=row["question"])
                answers.append(str(got.number).strip())
                fh.write(json.dumps({"input": root_input(row["text"], row["question"]),
                                     "target": row["count"]}) + "\n")
    finally:
        DSPyInstrumentor().uninstrument()
        provider.shutdown()
    return answers


_PLAIN: list[CountPipeline] = []


def answer(sentence: str, question: str) -> str:
    """The program on one example, untraced, its model wherever OPENAI_BASE_URL points
    (LiteLLM reads it): how `python -m engine trace --pipeline` runs it through the
    gateway (docs/pipelines.md)."""
    if not _PLAIN:
        dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
        dspy.configure(lm=dspy.LM(f"openai/{os.environ.get('DSPY_MODEL', 'qwen')}",
                                  cache=False, temperature=0, max_tokens=256),
                       adapter=dspy.ChatAdapter())
        _PLAIN.append(CountPipeline())
    return str(_PLAIN[0](sentence=sentence, question=question).number).strip()


def main() -> None:
    command_line(__doc__, run, "expected numbers")


if __name__ == "__main__":
    main()
