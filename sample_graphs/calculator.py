"""A GSM8K pipeline with a calculator tool, built with the Python API (engine.Graph).

    plan  (LLM)       question -> one arithmetic expression
    calc  (function)  plan -> its value, computed by `calculator` (safe: no eval)
    final (LLM)       question, calc -> the final number            (metric: numeric)

`calc` has a description, so the backward pass treats it like an LLM node: given the
feedback on `final`, one joint call says how `plan` should change, knowing what the tool
did with it. Run it (offline; --backend local is the embedded SmolLM2-135M model):

    .venv/bin/python sample_graphs/calculator.py --backend local --steps 1 --train 3 --val 3
    .venv/bin/python sample_graphs/calculator.py --data-dir ../shared/datasets   # real GSM8K

Without --data-dir it uses the 16 small word problems below, written for this project.
As a --functions file, `python -m engine run GRAPH.yaml --functions sample_graphs/calculator.py`
binds a graph file's `function: calculator` to the tool below.
"""

from __future__ import annotations

import argparse
import ast
import operator
import re
from typing import Any

from engine import Graph, optimize

_OPERATORS: dict[type, Any] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos,
}
_CANDIDATE = re.compile(r"[\d.(][\d\s.+\-*/%()]*")


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression: numbers, + - * / // % ** and parentheses.
    Anything else (names, calls, attributes, huge powers) raises ValueError; no code runs."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, RecursionError, MemoryError):
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPERATORS[type(node.op)](left, right)
        raise ValueError(f"not allowed in a calculation: {ast.dump(node)[:60]}")

    try:
        return value(tree.body)
    except (ZeroDivisionError, OverflowError, RecursionError) as exc:
        raise ValueError(f"cannot compute: {exc.__class__.__name__}") from None


def calculator(text: str) -> str:
    """The tool: the value of the longest arithmetic expression in `text` (x, × and ÷
    read as * and /; thousands separators dropped), or a line starting 'error:'."""
    cleaned = re.sub(r"(?<=\d),(?=\d{3})", "", text).replace("×", "*").replace("÷", "/")
    cleaned = re.sub(r"(?<=\d)\s*[xX]\s*(?=\d)", "*", cleaned)
    candidates = sorted((m.group().strip() for m in _CANDIDATE.finditer(cleaned)), key=len,
                        reverse=True)
    for candidate in candidates:
        try:
            result = evaluate(candidate)
        except ValueError:
            continue
        return f"{result:g}" if isinstance(result, float) else str(result)
    return f"error: no arithmetic expression found in {text.strip()[:80]!r}"


def build_graph() -> Graph:
    g = Graph(name="calculator-gsm8k", input_fields=["question"], target_field="answer",
              metric="numeric", answer_format="Give only the final number.",
              description="GSM8K with a calculator tool fed an expression by an LLM node.")
    g.llm("plan", inputs=["question"],
          prompt="Write one arithmetic expression, with numbers and + - * / only, whose value "
                 "answers the question.")
    g.function("calc", fn=calculator, inputs=["plan"],
               description="A calculator: evaluates the arithmetic expression in its input "
                           "(numbers, + - * / and parentheses) and returns the number, or "
                           "'error: ...' when the input holds no valid expression.")
    g.llm("final", inputs=["question", "calc"], output=True,
          prompt="Give the answer to the question.")
    return g


# Original word problems in the style of GSM8K, written for this project.
PROBLEMS = [
    ("A baker makes 12 loaves each morning and 7 each evening. How many loaves in 3 days?", 57),
    ("Mia has 45 stickers and gives 3 friends 8 stickers each. How many are left?", 21),
    ("A train travels 60 km an hour for 4 hours, then 50 km an hour for 2 hours. "
     "How many km in all?", 340),
    ("Tom buys 6 pens at 3 dollars each and a book for 14 dollars. What does he spend?", 32),
    ("A garden has 8 rows of 15 tulips. 27 tulips are picked. How many remain?", 93),
    ("Each box holds 24 eggs. How many boxes are needed for 192 eggs?", 8),
    ("Sara reads 35 pages a day for 6 days and 20 pages on the seventh. Pages read?", 230),
    ("A class of 28 students splits into teams of 4. Each team gets 3 balls. "
     "How many balls?", 21),
    ("A shop sells 125 apples on Monday and twice as many on Tuesday. Total apples?", 375),
    ("Ben saves 15 dollars a week for 9 weeks and then spends 40. How much is left?", 95),
    ("A tank holds 500 liters. 3 buckets of 45 liters are taken out. Liters left?", 365),
    ("Four friends share 84 cookies equally, then each eats 5. Cookies left per friend?", 16),
    ("A farmer has 17 cows and 3 times as many sheep. How many animals?", 68),
    ("A ticket costs 12 dollars; a group of 9 gets 18 dollars off the total. "
     "What do they pay?", 90),
    ("A printer prints 40 pages a minute. How many pages in a quarter of an hour?", 600),
    ("Lena runs 5 km on weekdays and 8 km on Saturday. How many km in a week "
     "(Sunday off)?", 33),
]


def sample_rows() -> list[dict[str, str]]:
    return [{"id": f"calc-{i:02d}", "question": q, "answer": str(a)}
            for i, (q, a) in enumerate(PROBLEMS)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="scripted", help="scripted | local | openai")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--train", type=int, default=4)
    parser.add_argument("--val", type=int, default=4)
    parser.add_argument("--test", type=int, default=0)
    parser.add_argument("--data-dir", help="use gsm8k/train from this data directory")
    parser.add_argument("--db", default="runs.duckdb")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    graph = build_graph()
    sizes = {"train": args.train, "val": args.val, "test": args.test}
    if args.data_dir:
        result = optimize(graph, dataset="gsm8k/train", splits=sizes, data_dir=args.data_dir,
                          backend=args.backend, steps=args.steps, db=args.db, seed=args.seed)
    else:
        rows = sample_rows()
        train, rest = rows[:args.train], rows[args.train:]
        val, test = rest[:args.val], rest[args.val:args.val + args.test]
        result = optimize(graph, train=train, val=val, test=test or None,
                          backend=args.backend, steps=args.steps, db=args.db, seed=args.seed)
        first = graph.forward(rows[0], backend=args.backend, prompts=result.prompts)
        print(f"one forward pass with the final prompts, on: {rows[0]['question']}")
        for node_id, activation in first.items():
            shown = activation.error or activation.output_text
            print(f"  {node_id:>5}: {shown.strip()[:100]!r}")
    print(f"run {result.run_id} ({result.status}) in {result.db}: "
          f"train {result.train_score}, val {result.val_score}, test {result.test_score}")
    for node_id, prompt in result.prompts.items():
        print(f"  prompt {node_id}: {prompt}")


if __name__ == "__main__":
    main()
