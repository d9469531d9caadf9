"""What the gateway changes in a call when the URL names a candidate (`/c/{name}/v1`).

A candidate knows each node of the run by the prompt the pipeline's code sends (the
node's prompt at version 0) and how that prompt sits in the call's system message (the
importer's call spec, engine/prompts/recorded.py): the whole system message; a template
whose `{variables}` this call filled; or the user's instructions inside a framework's
text (DSPy's adapter, each line indented). A request is the node its `X-Semback-Node`
header or `metadata.semback_node` names, else the node whose prompt its system message
matches. For that node the candidate either:

- sends another prompt: the new template rendered with this call's own variables, or the
  new instructions in place of the old inside the framework's text; or
- answers in place of the model with a patched reply (a gradient probe's), which the
  pipeline's own code then reads and acts on downstream.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from engine.prompts.recorded import PLACEHOLDER

NODE_HEADER = "x-semback-node"
NODE_METADATA = "semback_node"


@dataclass(frozen=True)
class NodeRule:
    """How one node's prompt sits in its calls' system message."""

    node: str
    original: str  # the prompt as the pipeline's code sends it
    system: dict[str, Any] | None = None  # the call spec's "system" (None: all of it)

    def _pattern(self) -> re.Pattern[str]:
        out, seen = [], set()
        at = 0
        for match in PLACEHOLDER.finditer(self.original):
            out.append(re.escape(self.original[at:match.start()]))
            name = match[1]
            out.append(f"(?P={name})" if name in seen else f"(?P<{name}>.*?)")
            seen.add(name)
            at = match.end()
        out.append(re.escape(self.original[at:]))
        return re.compile("".join(out), re.S)

    def _block(self, prompt: str) -> str:
        indent = (self.system or {}).get("indent", "")
        return "".join("\n" + indent + line for line in prompt.splitlines()) if indent \
            else prompt

    def match(self, system: str) -> dict[str, str] | None:
        """This call's template variables when its system message is this node's ({} for
        a plain prompt), else None."""
        if not self.original:
            return None
        if self.system and "variables" in self.system:
            found = self._pattern().fullmatch(system)
            return dict(found.groupdict()) if found else None
        if self.system and ("indent" in self.system or "before" in self.system):
            return {} if self._block(self.original) in system else None
        return {} if system == self.original else None

    def render(self, system: str, prompt: str, variables: dict[str, str]) -> str:
        """The system message with `prompt` in place of the node's prompt."""
        if self.system and "variables" in self.system:
            return PLACEHOLDER.sub(lambda m: variables.get(m[1], m[0]), prompt)
        if self.system and ("indent" in self.system or "before" in self.system):
            return system.replace(self._block(self.original), self._block(prompt), 1)
        return prompt


@dataclass
class Candidate:
    """A prompt set and patched replies, by node; `rules` tell the nodes' calls apart."""

    name: str
    rules: list[NodeRule]
    prompts: dict[str, str] = field(default_factory=dict)  # node -> the prompt to send
    replies: dict[str, str] = field(default_factory=dict)  # node -> the reply to serve

    def identify(self, body: dict[str, Any], named: str | None = None
                 ) -> tuple[str | None, dict[str, str]]:
        """The node a request is (and its template variables), or (None, {})."""
        named = named or _metadata_node(body)
        system = system_text(body)
        for rule in self.rules:
            if named and rule.node != named:
                continue
            variables = rule.match(system) if system is not None else None
            if variables is not None or named:
                return rule.node, variables or {}
        return (named, {}) if named else (None, {})

    def apply(self, body: dict[str, Any], node: str | None, variables: dict[str, str]
              ) -> tuple[dict[str, Any], str | None]:
        """(the request to send, the reply to serve instead or None)."""
        if node is None:
            return body, None
        if node in self.replies:
            return body, self.replies[node]
        prompt = self.prompts.get(node)
        rule = next((r for r in self.rules if r.node == node), None)
        if prompt is None or rule is None or prompt == rule.original:
            return body, None
        system = system_text(body)
        if system is None or rule.match(system) is None:
            return body, None
        out = copy.deepcopy(body)
        message = next(m for m in out["messages"] if isinstance(m, dict)
                       and m.get("role") in ("system", "developer"))
        message["content"] = rule.render(system, prompt, variables)
        return out, None


def system_text(body: dict[str, Any]) -> str | None:
    """The first system (or developer) message's text, or None."""
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") in ("system", "developer"):
            content = message.get("content")
            if isinstance(content, list):
                return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
            return "" if content is None else str(content)
    return None


def _metadata_node(body: dict[str, Any]) -> str | None:
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get(NODE_METADATA), str):
        return metadata[NODE_METADATA]
    return None
