"""The example record and the one seeded permutation that cuts disjoint splits."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Example:
    """One dataset row. `id` is stable (its position in the source file, or the row's own id)."""

    id: str
    fields: dict[str, str] = field(hash=False)
    target: str = ""
    # where the row came from ("file:line"), for error messages; not part of equality
    source: str = field(default="", compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class Splits:
    train: list[Example]
    val: list[Example]
    test: list[Example]

    def by_name(self) -> dict[str, list[Example]]:
        return {"train": self.train, "val": self.val, "test": self.test}


class SplitError(ValueError):
    pass


def split_examples(examples: list[Example], seed: int, n_train: int, n_val: int,
                   n_test: int | None) -> Splits:
    """One permutation seeded by `seed`, cut into consecutive, disjoint slices.

    `n_test=None` takes every example left after train and validation. Duplicate ids are
    rejected, so no example can ever sit in two splits.
    """
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise SplitError("dataset has duplicate example ids")
    needed = n_train + n_val + (n_test or 0)
    if needed > len(examples):
        raise SplitError(f"asked for {n_train} train + {n_val} val + {n_test or 0} test "
                         f"examples but the dataset has only {len(examples)}")
    order = list(examples)
    random.Random(seed).shuffle(order)
    train = order[:n_train]
    val = order[n_train:n_train + n_val]
    rest = order[n_train + n_val:]
    test = rest if n_test is None else rest[:n_test]
    return Splits(train, val, test)
