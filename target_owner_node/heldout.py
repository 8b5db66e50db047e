"""Loading the owner's splits. Shared by the server process (which needs only public facts:
the size N and, for the test split, each row's domain) and the evaluation worker (which
needs the rows themselves).

Errors name the file and the fix, never a row's content.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from rlvr_core.tasks.example import Example
from rlvr_core.tasks.io import ExampleFileError, read_examples


class HeldoutError(ValueError):
    """The held-out or test data cannot be served (missing, unreadable, too small)."""


def load_split(path: Path, verifier: str) -> list[Example]:
    """Read a split; when `verifier` is not 'per_example', every row uses that verifier."""
    if not Path(path).is_file():
        raise HeldoutError(f"data file not found: {path}")
    try:
        examples = read_examples(path)
    except ExampleFileError as error:  # its messages name file, line and field, never content
        raise HeldoutError(f"{path}: {error}") from None
    except Exception as error:  # noqa: BLE001 - any parser error; its text could quote a row, so it is dropped
        raise HeldoutError(
            f"could not read {path} ({type(error).__name__}); check that it is JSONL or parquet with one "
            f"example per row (fields: id, prompt, answer, verifier, ...)"
        ) from None
    if verifier != "per_example":
        examples = [dataclasses.replace(example, verifier=verifier) for example in examples]
    return examples


@dataclass(frozen=True)
class SplitFacts:
    """What the server process keeps about its splits: sizes and test-row domains only."""

    heldout_size: int
    test_domains: tuple[str, ...] | None  # each test row's domain; None when the test split is disabled
    declared_test_domains: tuple[str, ...] = ()  # data.test_domains: public, the only possible map keys

    @property
    def test_size(self) -> int:
        return len(self.test_domains) if self.test_domains is not None else 0


def row_domain(example: Example) -> str:
    """The domain a test row is reported under."""
    return example.domain or example.task or "all"


def split_facts(
    heldout_path: Path,
    test_path: Path | None,
    verifier: str,
    min_heldout_size: int,
    declared_domains: list[str] | tuple[str, ...] | None = None,
) -> SplitFacts:
    """Load both splits once to check them; refuse a held-out set below `min_heldout_size`.

    `test_path` None means the test split is disabled. With `declared_domains` (data.test_domains),
    every test row's domain must be declared: the error names the row's position, never its domain.
    """
    heldout = load_split(heldout_path, verifier)
    if len(heldout) < min_heldout_size:
        raise HeldoutError(
            f"data.heldout_path: {heldout_path} has {len(heldout)} examples but data.min_heldout_size is "
            f"{min_heldout_size}. A small held-out set gives noisy feedback and weak privacy; add examples "
            f"(or lower min_heldout_size knowingly)."
        )
    test_domains = None
    if test_path is not None:
        test = load_split(test_path, verifier)
        if not test:
            raise HeldoutError(f"data.test_path: {test_path} has no examples; remove test_path or fill it")
        test_domains = tuple(row_domain(example) for example in test)
        if declared_domains is not None:
            declared = set(declared_domains)
            for position, domain in enumerate(test_domains):
                if domain not in declared:
                    raise HeldoutError(
                        f"data.test_path: row {position} (0-based) of {test_path} has a domain that is not in "
                        f"data.test_domains; declare every domain the test split uses (they are published by "
                        f"GetInfo), or fix that row's domain"
                    )
    declared = tuple(declared_domains or ()) if test_domains is not None else ()  # published only when served
    return SplitFacts(len(heldout), test_domains, declared)
