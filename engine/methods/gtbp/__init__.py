"""Graph-based target back-propagation (GTBP; Zhu et al., arXiv 2606.14155).

Instead of critiques, GTBP passes back *targets*: the output node's target is the
example's reference answer. In reverse topological order, a node v with target Ô_v gets
one call (role "gtbp_input") asking which input Î_v would have made v, with its prompt
unchanged, produce Ô_v while staying close to its actual input; each predecessor reads
its own target output off its block of Î_v. Function nodes apply their backward rule
(engine/core/functions.py: extractors pass the target on, `concatenate` splits it by part);
nodes that read only example fields stop.

Several successors (left open by the paper; this project's extension): like semantic
backpropagation treats siblings, ONE call (role "gtbp_combine") sees all successors'
targets together, in successor (topological) order, and states one target for the node.
A single target is used as it is, without a call.

Update: a prompt is an ordered list of short claims ("- claim" lines). The update call
sees (I_v, O_v, Ô_v) for the sampled examples and the numbered claims, and may change at
most edit_budget(t) claims (claims.py has the schedule). As in the paper, by default the
list only grows (no deletion) and has no cap; `allow_delete` and `max_claims` are this
project's options. The budget is enforced in code: changes beyond it are reverted (the
first n, in claim order, are kept) and the proposal records a parse_error saying so.

Run log (`gradients` table): kind 'target' for each target a node received (from_node_id
= the successor, or 'loss' for the output node), kind 'aggregate' for the one target the
node acted on, kind 'inferred_input' for Î_v (from_node_id NULL, the rendered blocks).

Layout: templates.py (prompts), replies.py (the roles' JSON shapes), claims.py
(schedule, claim lists, the budget), targets.py (reply parsers), method.py (the `GTBP`
method).
"""

from engine.methods.gtbp import replies  # noqa: F401 - registers the roles' JSON shapes
from engine.methods.gtbp.claims import (
    edit_budget,
    enforce_budget,
    may_add_claim,
    parse_claims_reply,
    render_claims,
    split_claims,
)
from engine.methods.gtbp.method import GTBP
from engine.methods.gtbp.targets import parse_inferred_input, parse_target
from engine.methods.gtbp.templates import (
    ADD_ALLOWED,
    ADD_FORBIDDEN,
    GTBP_COMBINE,
    GTBP_EXAMPLE,
    GTBP_INPUT,
    GTBP_SYSTEM,
    GTBP_UPDATE,
)

__all__ = [
    "ADD_ALLOWED", "ADD_FORBIDDEN", "GTBP", "GTBP_COMBINE", "GTBP_EXAMPLE", "GTBP_INPUT",
    "GTBP_SYSTEM", "GTBP_UPDATE", "edit_budget", "enforce_budget", "may_add_claim",
    "parse_claims_reply", "parse_inferred_input", "parse_target", "render_claims",
    "split_claims",
]
