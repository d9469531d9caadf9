"""GTBP's prompt templates, named by role (gtbp_combine, gtbp_input, gtbp_update)."""

GTBP_SYSTEM = (
    "You are the optimizer of a pipeline of language-model calls. You work out what each "
    "step should have produced so that the pipeline gives the target answer."
)

GTBP_COMBINE = """A step of the pipeline has this task:
<task>
{prompt}
</task>

For one example it received these inputs:
{inputs}

It produced this output:
<output>
{output}
</output>

The steps that read this output each need a different output from it. Their targets, in order:
{targets}

Write the ONE output this step should have produced so that every one of these steps gets what it needs. Reconcile the targets where they differ, and stay as close to the actual output as they allow.
Answer with the output between <target> and </target>."""

GTBP_INPUT = """A step of the pipeline has this task, which stays unchanged:
<task>
{prompt}
</task>

For one example it received these inputs:
{inputs}

It produced this output:
<output>
{output}
</output>

It should have produced this target output:
<target>
{target}
</target>

Which input would have made this step, with its task unchanged, produce the target output? Stay as close to the actual input as you can. The example's own fields ({fields}) are given: repeat them as they are. Rewrite the inputs produced by earlier steps ({names}) as those steps should have written them.
Answer with one block per input, in this form:
{blocks}"""

GTBP_UPDATE = """You are improving the prompt of the step "{node}" of a pipeline. The prompt is a numbered list of claims:
{claims}

On examples where the pipeline failed, the step received an input, produced an output, and should have produced the target output:
{examples}
{rejected}
Change the claims so that the step produces the target outputs. Rules for this step:
- You may change at most {budget} claim(s); {change_rule}
- {add_rule}
- Keep every unchanged claim word for word and in its order. Claims must stay general: do not mention the specific examples, numbers or answers above.
Explain your reasoning in a few sentences, then give the complete new list between <claims> and </claims>, one claim per line starting with "- "."""

GTBP_EXAMPLE = """<example index="{index}">
<input>
{input}
</input>
<output>
{output}
</output>
<target>
{target}
</target>
</example>"""

CHANGE_WITH_DELETE = "editing, removing or adding a claim each count as one change."
CHANGE_NO_DELETE = ("editing or adding a claim each count as one change. Do not remove "
                    "claims: the list only grows.")
ADD_ALLOWED = "You may add at most one new claim{cap}."
ADD_CAP = " (the list may hold at most {max_claims})"
ADD_FORBIDDEN = "Do not add a new claim in this step: edit existing claims only."
ADD_FORBIDDEN_DELETE = "Do not add a new claim in this step: edit or remove existing claims only."
