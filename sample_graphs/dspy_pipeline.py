"""A DSPy program of three predictors, traced with OpenInference's DSPy instrumentor, for
`python -m engine import-traces` (docs/traces.md).

Each sentence tells of a purchase with a coupon ("Lena bought 4 notebooks at 3 euros each
and used a 2-euro coupon."); the program answers what was paid (10):

- `facts` (Predict(ExtractFacts)) reads the sentence and states the quantity and the unit
  price;
- `coupon` (Predict(FindCoupon)) reads the sentence and should give the coupon's value, but
  its instructions (the signature's docstring) are plainly at fault: they ask how the
  customer feels about the purchase;
- `total` (ChainOfThought(ComputeTotal)) reads both outputs, never the sentence, and
  gives the quantity times the unit price minus the coupon.

Every call goes through DSPy's default ChatAdapter to `dspy.LM("openai/MODEL")` at
--base-url, uncached, at temperature 0; nothing else is contacted (LiteLLM reads its
bundled model cost map, DSPy's disk and memory caches are off). Run it against any
OpenAI-compatible server on 127.0.0.1 (the embedded model served by llama.cpp, or the
scripted server of the tests):

    python sample_graphs/dspy_pipeline.py --base-url http://127.0.0.1:8080/v1 \\
        --model qwen --out traces.jsonl --limit 12

It writes the spans as OTLP JSON lines (one ExportTraceServiceRequest a line, the
OpenTelemetry Collector's file format) to --out, and each sentence's expected payment to
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

DATA = Path(__file__).parent / "data" / "dspy_coupons.jsonl"


class ExtractFacts(dspy.Signature):
    """Extract the quantity and the unit price stated in the sentence."""

    sentence: str = dspy.InputField()
    facts: str = dspy.OutputField()


class FindCoupon(dspy.Signature):
    """Say in one short sentence how the customer feels about the purchase."""
    # the planted fault: it should give the coupon's value, in euros

    sentence: str = dspy.InputField()
    coupon: str = dspy.OutputField()


class ComputeTotal(dspy.Signature):
    """Compute what the customer paid: the quantity times the unit price, minus the
    coupon's value. Give the number only."""

    facts: str = dspy.InputField()
    coupon: str = dspy.InputField()
    total: str = dspy.OutputField()


SIGNATURES = {"facts": ExtractFacts, "coupon": FindCoupon, "total": ComputeTotal}


def renamed(signature: type[dspy.Signature], like: type[dspy.Signature]
            ) -> type[dspy.Signature]:
    """`signature` under `like`'s class name, so its spans keep their names
    (Predict(FindCoupon).forward) when only the instructions change."""
    signature.__name__, signature.__qualname__ = like.__name__, like.__qualname__
    return signature


class CouponPipeline(dspy.Module):
    """facts and coupon read the sentence; total reads their outputs."""

    def __init__(self, instructions: dict[str, str] | None = None) -> None:
        super().__init__()
        sigs = {name: renamed(sig.with_instructions(instructions[name]), sig)
                if instructions and name in instructions else sig
                for name, sig in SIGNATURES.items()}
        self.facts = dspy.Predict(sigs["facts"])
        self.coupon = dspy.Predict(sigs["coupon"])
        self.total = dspy.ChainOfThought(sigs["total"])

    def forward(self, sentence: str) -> dspy.Prediction:
        facts = self.facts(sentence=sentence).facts
        coupon = self.coupon(sentence=sentence).coupon
        return self.total(facts=facts, coupon=coupon)


def root_input(sentence: str) -> str:
    """The root span's input.value as the DSPy instrumentor records it: the module's
    keyword arguments as JSON."""
    return safe_json_dumps({"sentence": sentence})


def run(base_url: str, model: str, out: str | Path | None, limit: int, targets: str | Path,
        instructions: dict[str, str] | None = None) -> list[str]:
    """Run the program on the first `limit` sentences, tracing every call to `out`;
    `instructions` replaces predictors' instructions by name (facts, coupon, total)."""
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    provider = tracer_provider(out, "dspy_pipeline")
    DSPyInstrumentor().instrument(tracer_provider=provider)
    lm = dspy.LM(f"openai/{model}", api_base=base_url, api_key="not-needed", cache=False,
                 temperature=0, max_tokens=256)
    program = CouponPipeline(instructions)
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()][:limit]
    answers = []
    try:
        with dspy.context(lm=lm, adapter=dspy.ChatAdapter()), \
                open(targets, "w", encoding="utf-8") as fh:
            for row in rows:
                answers.append(str(program(sentence=row["text"]).total).strip())
                fh.write(json.dumps({"input": root_input(row["text"]),
                                     "target": row["answer"]}) + "\n")
    finally:
        DSPyInstrumentor().uninstrument()
        provider.shutdown()
    return answers


def main() -> None:
    command_line(__doc__, run, "expected payments")


if __name__ == "__main__":
    main()
