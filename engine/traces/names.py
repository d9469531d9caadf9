"""What each call site of an imported pipeline is called: the name its code gives it, else
what it is told to be, else the tool it is made to call.

- A call inside a unit is named by the unit: DSPy's signature, a LangChain step's run
  name or `assign` key, a function the user traced (engine/traces/infer.py finds units).
- A call with no unit whose span name is a framework's own (`ChatCompletion`,
  `ChatOpenAI`: engine/traces/conventions.py) is named by its prompt: the role a "You are
  a/an/the ..." prompt gives it, up to the first word that is no longer part of the role
  ("You are the order assistant of {shop}" is `order_assistant`), else the first words
  that tell its prompt from the other such calls' ("Weather lookup: ..." is `weather`);
  a call with no prompt at all by the tool it is made to call, or the one it is offered.
- Any other call by its span name, told apart from another of the same name by the first
  words of their prompts.

Names are unique: a name taken twice gets a number.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from engine.traces.conventions import GENERIC_NAMES
from engine.traces.otlp import Call

ROLE = re.compile(r"\s*you\s+are\s+(?:a|an|the)\s+", re.I)
# words that end a role's name ("order assistant | of the shop")
NOT_THE_NAME = frozenset("of for in at to on with and or who that which from by as is "
                         "whose when where your you".split())
ROLE_WORDS = 3  # a role's name is at most this many words
WORDS = re.compile(r"[A-Za-z0-9]+")
RESERVED = frozenset({"input"})  # an example field's name, never a node's


@dataclass(frozen=True)
class SiteName:
    """What a call site's name is made from."""

    key: tuple  # the call site
    name: str  # its unit's name, else its span name
    unit: bool  # `name` is a unit's: the code's own
    prompt: str = ""  # its prompt as written (template or system message)
    tool: str | None = None  # the tool it is made to call, or its only tool


def slug(text: str) -> str:
    """NoteSentence -> note_sentence; "ChatOpenAI" -> chat_open_ai."""
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text)
    words = WORDS.findall(text.lower())
    return "_".join(words)[:40].strip("_") or "call"


def role_name(prompt: str) -> str | None:
    """The role a "You are a/an/the ..." prompt gives its call, as a name, or None."""
    found = ROLE.match(prompt)
    if not found:
        return None
    phrase = re.split(r"[.,:;!?()\n]", prompt[found.end():], maxsplit=1)[0]
    words: list[str] = []
    for word in WORDS.findall(phrase.lower()):
        if word in NOT_THE_NAME or len(words) == ROLE_WORDS:
            break
        words.append(word)
    return "_".join(words) or None


def distinct_words(text: str, others: list[str], most: int = 6) -> str:
    """The shortest start of `text` (1 to `most` words) that no other text starts with."""
    words = WORDS.findall(text.lower())
    rest = [WORDS.findall(o.lower()) for o in others if o != text]
    for n in range(1, min(most, len(words)) + 1):
        if all(o[:n] != words[:n] for o in rest):
            return "_".join(words[:n])
    return "_".join(words[:most])


def node_ids(sites: list[SiteName]) -> dict[tuple, str]:
    """Call site -> a readable, unique node id (the rules above)."""
    unique: dict[tuple, SiteName] = {}
    for site in sites:
        unique.setdefault(site.key, site)
    unnamed = [s for s in unique.values() if not s.unit and GENERIC_NAMES.match(s.name)]
    base: dict[tuple, str] = {}
    for key, site in unique.items():
        if site in unnamed:
            others = [o.prompt for o in unnamed if o is not site]
            base[key] = role_name(site.prompt) or (
                distinct_words(site.prompt, others) if WORDS.search(site.prompt) else "") \
                or (slug(site.tool) if site.tool else "") or slug(site.name)
        else:
            base[key] = slug(site.name)
    counts = Counter(base.values())
    told = {key: distinct_words(site.prompt, [o.prompt for k, o in unique.items()
                                              if base[k] == base[key] and not o.unit])
            for key, site in unique.items()  # two call sites of one span name: by prompt
            if counts[base[key]] > 1 and not site.unit and site not in unnamed}
    base.update((key, name) for key, name in told.items() if name)
    ids: dict[tuple, str] = {}
    taken: set[str] = set()
    for key in unique:
        node_id, n = base[key], 2
        while node_id in taken or node_id in RESERVED:
            node_id, n = f"{base[key]}_{n}", n + 1
        taken.add(node_id)
        ids[key] = node_id
    return ids


def tool_of(call: Call) -> str | None:
    """The tool a call is made to call (its forced tool_choice), else its only tool."""
    tools = call.tools or {}
    choice = tools.get("tool_choice")
    if isinstance(choice, dict):
        return str((choice.get("function") or {}).get("name") or "") or None
    offered = [str((t.get("function") or {}).get("name") or "") for t in tools.get("tools")
               or [] if isinstance(t, dict)]
    return offered[0] or None if len(offered) == 1 else None
