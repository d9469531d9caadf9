"""A LangChain chain of three steps, traced with OpenInference's LangChain instrumentor, for
`python -m engine import-traces` (docs/traces.md).

Each sentence names a city ("After a month in Asia we flew home to Toronto."); the chain
answers the continent it lies in, in one word (America), one step feeding the next:

- `city` reads the sentence and names the city (Toronto);
- `country` should name the city's country (Canada), but its prompt is plainly at fault:
  it asks for the language people speak there (English);
- `continent` names the continent of what it is given (Europe, for English).

Each step is ChatPromptTemplate | ChatOpenAI | StrOutputParser with its own run_name, and
the whole chain is one run (`pipeline`), so one trace a sentence. Run it against any
OpenAI-compatible server on 127.0.0.1 (the embedded model served by llama.cpp, or the
scripted server of the tests):

    python sample_graphs/langchain_pipeline.py --base-url http://127.0.0.1:8080/v1 \\
        --model qwen --out traces.jsonl --limit 12

It writes the spans as OTLP JSON lines (one ExportTraceServiceRequest a line, the
OpenTelemetry Collector's file format) to --out, and each sentence's expected continent to
--targets (default: targets.jsonl beside --out). With OTEL_EXPORTER_OTLP_ENDPOINT set and no
--out, the spans go to that OTLP/HTTP endpoint instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable
from langchain_openai import ChatOpenAI
from openinference.instrumentation.langchain import LangChainInstrumentor

sys.path.insert(0, str(Path(__file__).parent))  # the exporter beside this script
from otlp_export import command_line, tracer_provider  # noqa: E402

DATA = Path(__file__).parent / "data" / "langchain_cities.jsonl"
PROMPTS = {
    "city": "City: name the city the sentence mentions. Reply with one word.",
    # the planted fault: it should name the country the city is in
    "country": "Country: name the language people speak in this city. Reply with one word.",
    "continent": "Continent: name the continent this country lies in. Reply with one word: "
                 "Africa, America, Asia, Europe or Oceania.",
}
# each step's user message; {text} is the chain's input (city) or the step before's reply
MESSAGES = {"city": "Sentence: {text}", "country": "City: {text}", "continent": "Country: {text}"}


def build_chain(llm: ChatOpenAI, prompts: dict[str, str]) -> Runnable:
    """city | country | continent, each step a prompt, the model and a string parser."""
    steps = [(ChatPromptTemplate.from_messages([("system", prompts[name]),
                                                ("human", MESSAGES[name])])
              | llm | StrOutputParser()).with_config(run_name=name)
             for name in ("city", "country", "continent")]
    return (steps[0] | steps[1] | steps[2]).with_config(run_name="pipeline")


def run(base_url: str, model: str, out: str | Path | None, limit: int, targets: str | Path,
        prompts: dict[str, str] | None = None) -> list[str]:
    """Run the chain on the first `limit` sentences, tracing every step to `out`."""
    provider = tracer_provider(out, "langchain_pipeline")
    LangChainInstrumentor().instrument(tracer_provider=provider)
    llm = ChatOpenAI(model=model, base_url=base_url, api_key="not-needed", temperature=0,
                     max_tokens=16)
    chain = build_chain(llm, {**PROMPTS, **(prompts or {})})
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()][:limit]
    answers = []
    try:
        with open(targets, "w", encoding="utf-8") as fh:
            for row in rows:
                answers.append(chain.invoke(row["text"]).strip())
                fh.write(json.dumps({"input": row["text"], "target": row["answer"]}) + "\n")
    finally:
        LangChainInstrumentor().uninstrument()
        provider.shutdown()
    return answers


def answer(text: str) -> str:
    """The chain on one sentence, untraced, its model wherever OPENAI_BASE_URL points: how
    `python -m engine trace --pipeline` runs it through the gateway (docs/pipelines.md)."""
    import os

    llm = ChatOpenAI(model=os.environ.get("LANGCHAIN_MODEL", "qwen"), temperature=0,
                     max_tokens=16)
    return build_chain(llm, PROMPTS).invoke(text).strip()


def main() -> None:
    command_line(__doc__, run, "expected continents")


if __name__ == "__main__":
    main()
