"""The embedded SmolLM2-135M under grammar-constrained decoding returns schema-valid JSON for
every structured reply role, in-process and served by llama-server (its `response_format`),
and the parsers read it without a fallback.

The schemas' string limits are shrunk for this test so that it stays short (one generation
of at most about a hundred tokens per role); their shape is each role's real one."""

from __future__ import annotations

import asyncio

import pytest

from engine.llm.client import LLMClient, RetryPolicy
from engine.methods.gtbp import parse_claims_reply, parse_inferred_input, parse_target
from engine.methods.gtbp import replies as gtbp_replies
from engine.prompts import structured as S
from engine.prompts import templates as P
from tests.support.json_schema import assert_follows
from tests.test_structured import NAMES, _view, role_messages

pytestmark = pytest.mark.embedded_model


@pytest.fixture(autouse=True)
def short_schemas(monkeypatch):
    for name, value in (("REASONING_CHARS", 60), ("REASONING_MIN", 10), ("GRADIENT_CHARS", 60),
                        ("PROMPT_CHARS", 80)):
        monkeypatch.setattr(S, name, value)
    for name, value in (("TARGET_CHARS", 60), ("CLAIM_CHARS", 40), ("MAX_CLAIMS", 2)):
        monkeypatch.setattr(gtbp_replies, name, value)


def messages_for(role):
    if role == "backward_evaluative":
        return P.backward_messages(P.BackwardView(**{**_view(NAMES).__dict__,
                                                     "mode": "evaluative"})), NAMES
    if role == "backward_single":
        return P.backward_messages(_view(["hint_a"])), ["hint_a"]
    return role_messages()[role]


def parsed_problem(role, text, names):
    if role.startswith("backward"):
        return P.parse_gradients(text, names)[1]
    if role == "update":
        return P.parse_prompt(text)[2]
    if role == "gtbp_combine":
        return parse_target(text)[1]
    if role == "gtbp_input":
        return parse_inferred_input(text, names, {"question"}, {})[1]
    return parse_claims_reply(text)[2]


ROLES = ["backward_joint", "backward_evaluative", "backward_single", "update", "gtbp_combine",
         "gtbp_input", "gtbp_update"]


@pytest.mark.parametrize("serving", ["in-process", "server"])
def test_every_role_gets_schema_valid_json_from_the_embedded_model(serving):
    from engine.llm.local import LocalBackend
    from engine.llm.server import served, server_binary

    MODEL_NAME = "smollm2-135m"  # the small model: fast, and what these replies were tuned on
    if serving == "server" and server_binary() is None:
        pytest.skip("llama-server is not built here (./dev setup builds it into .venv/bin)")

    async def go():
        backend = served(LocalBackend(model=MODEL_NAME, n_ctx=1024), serving)
        client = LLMClient(forward_backend=backend, forward_model=MODEL_NAME, structure=S.prepare,
                           retry=RetryPolicy(max_retries=0, timeout=300))
        out = []
        try:
            for role in ROLES:
                messages, names = messages_for(role)
                purpose = "update" if role in ("update", "gtbp_update") else "backward"
                request = client.request(purpose, messages, max_tokens=8,  # raised to fit
                                         meta={"role": role, "inputs": names})
                out.append((role, names, request, await client.call(request, step=1)))
        finally:
            await client.aclose()
        return out

    for role, names, request, record in asyncio.run(go()):
        assert request.schema is not None and record.error is None, (role, record.error)
        assert record.constrained is True
        assert_follows(request.schema, record.response)
        assert parsed_problem(role, S.reply_text(record.response, role, names), names) is None, \
            (role, record.response)


def test_the_grammar_forbids_raw_newlines_inside_json_strings():
    """The schema converter's character rule lets raw control characters into strings,
    which makes the reply invalid JSON; the backend narrows it."""
    from engine.llm.local import LocalBackend

    grammar = LocalBackend(model="smollm2-135m")._grammar(S.schema_for("update"))._grammar
    [rule] = [line for line in grammar.splitlines() if line.startswith("char ::=")]
    assert "\\x00-\\x1F" in rule
    # ... and a required text opens with a letter or digit, not with JSON punctuation
    for field in ("reasoning", "prompt"):
        [line] = [x for x in grammar.splitlines() if x.startswith(f"{field} ::=")]
        assert line.startswith(f'{field} ::= "\\"" first-char ')
    assert "first-char ::= [A-Za-z0-9]" in grammar.splitlines()
