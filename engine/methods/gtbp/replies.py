"""GTBP's reply roles as JSON: the shape of each (its fields, how the reply reads back in
the text format of templates.py), registered with the prompt layer's structured replies
(engine/prompts/structured.py) when the method is imported."""

from __future__ import annotations

from engine.prompts import structured as S
from engine.prompts import templates as P

TARGET_CHARS = 320  # a target or an inferred input
CLAIM_CHARS = 200   # one claim
MAX_CLAIMS = 8

ROLES = ("gtbp_combine", "gtbp_input", "gtbp_update")


def _claims_text(data: dict, why: str) -> str | None:
    claims = [c.strip() for c in data.get("claims") or [] if isinstance(c, str) and c.strip()]
    if not claims:
        return None
    return why + "\n<claims>\n" + "\n".join(f"- {c}" for c in claims) + "\n</claims>"


S.register_shape("gtbp_combine", S.ReplyShape(
    fields=lambda names: [("target", S.text_field(TARGET_CHARS, 1),
                           "the one output this step should have produced")],
    to_text=lambda field, data, names, why: (
        f"{why}\n<target>{field('target')}</target>" if field("target") else None),
    asks=("Answer with the output between <target> and </target>.",)))
S.register_shape("gtbp_input", S.ReplyShape(
    fields=lambda names: [(n, S.text_field(TARGET_CHARS, 1), f"the input {n} as it should be")
                          for n in names],
    to_text=lambda field, data, names, why: "\n".join(
        f'<input name="{n}">\n{field(n)}\n</input>' for n in names if field(n)),
    text_form=lambda names: "\n".join(
        P.INPUT_BLOCK.format(name=n, value=f"the input {n} as it should be") for n in names)))
S.register_shape("gtbp_update", S.ReplyShape(
    fields=lambda names: [("claims", {"type": "array", "items": S.text_field(CLAIM_CHARS, 1),
                                      "minItems": 1, "maxItems": MAX_CLAIMS},
                           "the complete new list of claims, one string per claim")],
    to_text=lambda field, data, names, why: _claims_text(data, why),
    asks=("Explain your reasoning in a few sentences, then give the complete new list "
          "between <claims> and </claims>, one claim per line starting with \"- \".",)))
