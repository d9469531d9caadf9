"""The scripted backend's default replies do not depend on the order of the prompt's parts."""

import asyncio

from engine.llm.base import LLMRequest
from engine.llm.scripted import ScriptedBackend


def _reply(content: str, purpose: str = "loss") -> str:
    request = LLMRequest(messages=(("system", "You grade answers."), ("user", content)),
                         model="m", purpose=purpose, meta={"node": "n"})
    return asyncio.run(ScriptedBackend().complete(request)).text


FIXED = "Task: grade the answer.\nReply with <score>N</score>."
EXAMPLE = "Question: what is 2 + 3?\nAnswer: 5"


def test_moving_a_block_of_the_prompt_keeps_the_reply():
    first = _reply(f"{FIXED}\n\n{EXAMPLE}")
    assert _reply(f"{EXAMPLE}\n\n{FIXED}") == first
    assert _reply(f"{EXAMPLE}\n{FIXED}\n") == first


def test_a_changed_example_line_changes_the_reply():
    replies = {_reply(f"{FIXED}\n\nQuestion: what is 2 + {n}?\nAnswer: {n + 2}")
               for n in range(8)}
    assert len(replies) > 1
