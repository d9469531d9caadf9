"""What `blame` reports (`BlameReport`, its `--json`), summed from the probes made:
the evidence per node, per method and per edge, the gradients' claims, and the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from engine.core.claims import gradient_claim
from engine.probes.adaptive import Spent
from engine.probes.plan import BlamePlan
from engine.probes.probe import (
    ProbeResult,
    descendants,
)
from engine.probes.tally import fixed_by, group, tally
from engine.probes.verdict import Evidence, NodeFact, Verdict, verdict, weigh, weighed
from engine.runlog.probing import (
    proposal_origin,
)


@dataclass
class BlameReport:
    run_id: str
    steps: list[int]
    which: str  # the --examples choice
    examples: list[tuple[int, str]]  # (step, example) probed as failing
    nodes: list[Evidence]  # gradient evidence per LLM node (the run's own method)
    edits: list[Evidence]  # edit evidence per LLM node
    evidence: str  # "gradient" or "edit": what the verdict weighs (`weigh`)
    verdict: Verdict
    claimed: str | None  # the node the gradients most often asked to change
    claims: list[dict[str, Any]] = field(default_factory=list)  # per (step, example, node)
    methods: list[Evidence] = field(default_factory=list)  # per (method, node)
    method_verdicts: dict[str, Verdict] = field(default_factory=dict)
    repeats: int = 1
    repeats_note: str = ""
    rewriter: str = ""  # the model that follows gradients (the optimizer model)
    forward_model: str = ""
    calls: int = 0
    model_calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    results: list[ProbeResult] = field(default_factory=list)

    edges: list[Evidence] = field(default_factory=list)  # per (method, node, successor)
    evidence_note: str = ""  # why the edit probes decide, when they do
    # examples pointing at `claimed`, examples pointing at any single node, examples with
    # claims (the counts behind "gradients point at")
    pointed: tuple[int, int, int] = (0, 0, 0)
    # of one step's blame, each probed edit that came from a candidate prompt set the step
    # did not keep (`proposal_origin`): node -> where it came from
    edit_origins: dict[str, str] = field(default_factory=dict)
    # adaptive blame (engine/probes/adaptive.py): the probes planned and made, and why the
    # rest were not; None when every planned probe was made (--exhaustive, pooled steps)
    spent: Spent | None = None
    estimate: str = ""  # what it said it would cost before it began

    @property
    def step(self) -> int | None:
        return self.steps[0] if len(self.steps) == 1 else None

    @property
    def facts(self) -> list[NodeFact]:
        """Per LLM node, what the verdict rests on (`weighed`): the counts the pages draw."""
        gradients = self.nodes if any(r.probed for r in self.nodes) else []
        return weighed(self.verdict, self.evidence, gradients, self.edits,
                       [r.node_id for r in self.nodes])

    @property
    def blamed(self) -> list[str]:
        """The node the probes name, or the nodes they tie on."""
        return [self.verdict.node] if self.verdict.node else list(self.verdict.tied)

    def as_json(self) -> dict[str, Any]:
        nodes = []
        edits = {e.node_id: e for e in self.edits}
        for row in self.nodes:
            data = row.as_json()
            data["edit"] = edits[row.node_id].as_json()
            if row.node_id in self.edit_origins:
                data["edit"]["origin"] = self.edit_origins[row.node_id]
            nodes.append(data)
        return {
            "run_id": self.run_id, "steps": self.steps, "examples": self.which,
            "probed_examples": len(self.examples), "evidence": self.evidence,
            "evidence_note": self.evidence_note,
            "nodes": nodes, "verdict": self.verdict.as_json(),
            "gradients_claimed": self.claimed,
            "gradients_pointed": dict(zip(("claimed", "single_node", "examples"),
                                          self.pointed)),
            "claims": self.claims,
            **({"methods": [{**m.as_json(), "method": m.method,
                             "verdict": self.method_verdicts[m.method].node,
                             "tied": self.method_verdicts[m.method].tied}
                            for m in self.methods]} if self.methods else {}),
            **({"edges": [edge_json(e) for e in self.edges]} if self.methods else {}),
            "repeats": self.repeats, "repeats_note": self.repeats_note,
            "confounds": {"rewriter_model": self.rewriter, "forward_model": self.forward_model,
                          "rewriter_is_optimizer_model": True},
            "cost": {"calls": self.calls, "model_calls": self.model_calls,
                     "tokens": self.tokens, "seconds": round(self.seconds, 3)},
            "adaptive": self.spent.as_json() if self.spent else None,
            "estimate": self.estimate,
        }


def edge_json(row: Evidence) -> dict[str, Any]:
    """One edge row: the gradient `source` received from `target` alone, followed."""
    low, high = row.interval
    return {"method": row.method, "source": row.node_id, "target": row.edge,
            "probed": row.probed, "flips": row.flips, "errors": row.errors,
            "leaks": row.leaks, "interval": [round(low, 4), round(high, 4)],
            "claimed": row.claimed, "mean_score_change": row.mean_score_change}


def summarize(run_id: str, steps: list[int], which: str, plans: list[BlamePlan],
              results: list[ProbeResult]) -> BlameReport:
    nodes = plans[0].nodes if plans else []
    grads = {n: Evidence(n, "gradient") for n in nodes}
    edits = {n: Evidence(n, "edit") for n in nodes}
    names = list(plans[0].by_method) if plans else []
    per_method = {(m, n): Evidence(n, "gradient", m) for m in names for n in nodes}
    graph = plans[0].run.graph if plans else None
    per_edge = {(m, n, t): Evidence(n, "gradient", m, edge=t) for m in names for n in nodes
                for t in graph.successors(n)}
    method_claims = {(m, p.run.step, e, n): c for p in plans
                     for m, cl in p.method_claims.items() for (e, n), c in cl.items()}
    edge_claims = {(m, p.run.step, e, n, t): c for p in plans
                   for m, edges in p.by_edge.items()
                   for (e, n, t), (_, c) in edges.items()}
    texts = {(p.run.step, e, n): t for p in plans for (e, n), t in p.gradients.items()}
    recorded = {(p.run.step, e, n): c for p in plans for (e, n), c in p.recorded.items()}
    claims = []
    for key, draws in group(results).items():
        kind, method, node, step, example, edge = key
        if kind == "edit":
            tally(edits[node], draws)
        elif method and edge:
            tally(per_edge[(method, node, edge)], draws,
                   edge_claims.get((method, step, example, node, edge), False))
        elif method:
            tally(per_method[(method, node)], draws,
                   method_claims.get((method, step, example, node), False))
        else:
            # the claim recorded at backward time; a log without one: read from the text
            asks, reading = recorded.get((step, example, node)) or gradient_claim(
                texts.get((step, example, node), ""))
            tally(grads[node], draws, asks)
            claims.append({"step": step, "example": example, "node": node, "asks_change": asks,
                           "reading": reading, "flipped": fixed_by(draws)})
    for p in plans:
        for n in p.copied:
            edits[n].copy_rejected += 1
        for n in p.unchanged:
            edits[n].unchanged += 1
    has_gradients = any(r.probed for r in grads.values())
    chosen, evidence, note = weigh(list(grads.values()) if has_gradients else [],
                                   list(edits.values()))
    # Per example, the gradients point at the node furthest upstream that they ask to
    # change: every request downstream of it traces back to it (the output node's own
    # gradient is the loss, which always asks). Two such nodes, neither upstream of the
    # other: the example points at no single node. Across examples: the most pointed at.
    asked: dict[tuple[int, str], set[str]] = {}
    for c in claims:
        if c["asks_change"]:
            asked.setdefault((c["step"], c["example"]), set()).add(c["node"])
    pointed: dict[tuple[int, str], str] = {}
    for key, asking in asked.items():
        roots = [n for n in asking
                 if not any(n in descendants(graph, m) for m in asking - {n})]
        if len(roots) == 1:
            pointed[key] = roots[0]
    claims_by_example = {(c["step"], c["example"]) for c in claims}
    counts = {n: list(pointed.values()).count(n) for n in nodes}
    top = max(counts.values(), default=0)
    leaders = [n for n, c in counts.items() if c == top and top > 0]
    examples = [(p.run.step, e) for p in plans for e in p.failing]
    report = BlameReport(run_id, steps, which, examples, list(grads.values()),
                         list(edits.values()), evidence, chosen,
                         leaders[0] if len(leaders) == 1 else None, claims,
                         list(per_method.values()), results=results, evidence_note=note)
    report.pointed = (top if len(leaders) == 1 else 0, len(pointed), len(claims_by_example))
    if len(plans) == 1:
        run = plans[0].run
        origins = {n: proposal_origin(run.db, run.run_id, run.step, n) for n in plans[0].edits}
        report.edit_origins = {n: origin for n, origin in origins.items() if origin}
    report.method_verdicts = {m: verdict([per_method[(m, n)] for n in nodes]) for m in names}
    for m, n, t in list(per_edge):  # one successor: the edge's gradient is the node's
        if len(graph.successors(n)) == 1:
            per_edge[(m, n, t)] = replace(per_method[(m, n)], edge=t)
    report.edges = list(per_edge.values())
    return report

