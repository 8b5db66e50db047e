"""Testbeds: a source mixture (what the trainer may train on) and a target mixture (what the
owner cares about), built deterministically from reasoning-gym generators.

A testbed is a TOML file (built-ins live in rlvr_core/tasks/testbeds/<name>.toml):

    name = "small"
    description = "..."
    seed = 7
    feedback_fraction = 0.4     # share of target data the owner keeps as its held-out split

    [[source]]
    task = "basic_arithmetic"   # a reasoning-gym dataset name
    domain = "add"              # a label for reporting and for the oracle policy
    difficulty = "easy"         # optional; cluster_of() is "add:easy"
    size = 100
    config = { operators = ["+"], min_terms = 2, max_terms = 2 }   # the dataset's config fields

    [[target]]
    ...

The target examples are split into `feedback` (the owner's held-out set, whose aggregate
accuracy is the trainer's feedback) and `test` (final evaluation only).

A multi-domain testbed in DataFlex-RL's shape (seed 001: math, logic, science; several
benchmarks per domain) names each target benchmark in `domain` (the public name the owner
reports its accuracy under) and the domain it measures in `family`; `[summaries]` declares
named benchmark subsets (e.g. a "math-heavy" summary) the bench reports beside the
domain-balanced one:

    [[target]]
    task = "chain_sum"
    domain = "math_chain"       # the benchmark: a declared, public test-split domain
    family = "math"             # the domain it measures (default: its own domain)
    ...

    [summaries]
    math_heavy = ["math_add", "math_chain", "text_count"]

A source entry may hold labels that are wrong for the target, as a scraped subset with broken
ground truths does. `corrupt` shifts every reference answer systematically; `label_quality`
says whether an entry's labels are right ("clean") or not ("wrong": the default with
`corrupt`), and `skill` names the target domain whose skill its prompts carry (default: its
own `domain`). Neither field reaches the trainer: its examples, cluster ids and pool look like
any clean entry's (name such an entry neutrally, e.g. `domain = "crawl"`); only the answers
differ. The oracle policy reads them (lab/policies/oracle.py) and samples clean skill
clusters only. A wrong-label entry never feeds the tiny policy's warm-up (curated SFT data),
so its prompts all go to the RL pool:

    [[source]]
    task = "letter_counting"
    domain = "crawl"            # a neutral, data_source-like cluster id
    skill = "count"             # hidden: the target skill its prompts carry
    size = 400
    config = { min_words = 3, max_words = 5 }
    corrupt = { kind = "shift", by = 1 }   # every answer + 1 (integer answers only)

A target entry whose commonest answer is frequent (a letter count of 1 in 61% of rows) lets a
policy score by guessing it. `max_answer_share` caps any one reference answer's share of the
entry: the builder draws extra examples from the same generator (same derived seed, so the
split stays a pure function of the spec) and rejects those whose answer already holds its share:

    [[target]]
    task = "letter_counting"
    domain = "count"
    size = 600
    config = { min_words = 3, max_words = 5 }
    max_answer_share = 0.25     # no answer in more than 150 of the 600 rows

An entry with `rubric = { items = [...] }` is a rubric task (rlvr_core/tasks/rubric.py): each row's
prompt also states k checkable items drawn for it, its reference answer meets them all, and the
exact grader `rubric` scores the fraction met (a graded score; issue 43). Duplicates and the answer
cap are decided on the generator's own prompt and answer, before the rubric is drawn.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import random
import re
import tomllib
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from rlvr_core.tasks.example import Example
from rlvr_core.tasks.prompting import DEFAULT_PROMPT_TEMPLATE, validate_template
from rlvr_core.tasks.rubric import RubricSpec, question_of

TESTBED_DIR = Path(__file__).with_name("testbeds")
DEFAULT_TESTBED = "default"
# Config fields the builder sets itself; a testbed may not override them.
_RESERVED_CONFIG_KEYS = ("seed", "size")
# Draws allowed per requested target example before giving up on finding unseen prompts.
_MAX_DRAWS_PER_EXAMPLE = 20
_LABEL_PATTERN = r"^[A-Za-z0-9_\-]+$"  # no ":" (cluster_of joins domain and difficulty with it)

# reasoning-gym generators whose rows depend on Python's per-process string-hash order (they iterate
# sets of strings), so one seed builds other prompts in every process: no run on them reproduces, and
# every run builds its own tiny policy. Found by generating every dataset under PYTHONHASHSEED 1 and 2
# (reasoning-gym 0.1.x defaults); tests/rlvr_core/test_testbed_spec.py re-checks the list.
HASH_ORDER_DEPENDENT_TASKS = frozenset({
    "isomorphic_strings", "knight_swap", "polynomial_multiplication", "ransom_note", "word_ladder"})


class TestbedError(ValueError):
    """A testbed file or spec is invalid; the message names the file and the field."""


class Corruption(BaseModel):
    """A systematic corruption of an entry's reference answers (the same rule for every row)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    kind: Literal["shift"]
    """"shift": an integer answer a becomes a + by (a count off by one, a sum off by ten)."""
    by: int = Field(default=1)

    @field_validator("by")
    @classmethod
    def _nonzero(cls, by: int) -> int:
        if by == 0:
            raise ValueError("must not be 0 (a shift by 0 leaves every label right)")
        return by

    def apply(self, answer: str, where: str) -> str:
        try:
            value = int(answer.strip())
        except ValueError:
            raise TestbedError(f"{where}.corrupt: kind 'shift' needs integer answers, got {answer!r}; "
                               f"use it on a task with integer answers (letter_counting, basic_arithmetic)") from None
        return str(value + self.by)


class MixtureEntry(BaseModel):
    """One reasoning-gym generator with its config, contributing `size` examples."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    task: str
    """A reasoning-gym dataset name (reasoning_gym.factory.DATASETS)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Fields of the dataset's config dataclass (seed and size are set by the builder)."""
    size: int = Field(gt=0, le=100_000)
    """Number of examples drawn from this generator."""
    domain: str = Field(pattern=_LABEL_PATTERN)
    """Skill label shared across source and target (e.g. "add")."""
    difficulty: str = Field(default="", pattern=r"^[A-Za-z0-9_\-]*$")
    """Optional difficulty label (e.g. "easy"); clusters are domain:difficulty."""
    family: str = Field(default="", pattern=r"^[A-Za-z0-9_\-]*$")
    """The domain family this entry measures or trains (DataFlex's math / logic / science); empty:
    its own `domain`. Target entries whose `domain` names a benchmark share a family, so the
    domain-balanced summary weighs families, not benchmarks, equally."""

    corrupt: Corruption | None = None
    """Source only: shift every reference answer of this entry (see the module docstring)."""
    label_quality: Literal["clean", "wrong"] | None = None
    """Source only, never seen by the trainer: whether the labels are right for the target.
    Default: "wrong" with `corrupt`, else "clean"."""
    skill: str = Field(default="", pattern=r"^[A-Za-z0-9_\-]*$")
    """Source only, never seen by the trainer: the target domain whose skill the prompts carry,
    for the oracle (empty: its own `domain`)."""
    max_answer_share: float | None = Field(default=None, gt=0.0, le=1.0)
    """Target only: no reference answer (stripped text) in more than floor(share * size) of the
    entry's rows; extra draws from the same generator replace the rejected ones. None: no cap."""
    rubric: RubricSpec | None = None
    """Make the entry a rubric task graded by the fraction of items met (rlvr_core/tasks/rubric.py).
    None: the generator's own task and reasoning-gym verifier."""

    @field_validator("rubric")
    @classmethod
    def _rubric_labels_are_clean(cls, rubric: RubricSpec | None, info: ValidationInfo) -> RubricSpec | None:
        if rubric is not None and info.data.get("corrupt") is not None:
            raise ValueError("cannot be combined with `corrupt` (a shifted answer no longer meets the "
                             "rubric's items); remove one of the two")
        return rubric

    @property
    def answer_cap(self) -> int | None:
        """The most rows one answer may hold (max_answer_share), or None without a cap."""
        if self.max_answer_share is None:
            return None
        return math.floor(self.max_answer_share * self.size + 1e-9)

    @property
    def family_name(self) -> str:
        return self.family or self.domain

    @property
    def quality(self) -> str:
        """The effective label quality: "wrong" or "clean"."""
        return self.label_quality or ("wrong" if self.corrupt is not None else "clean")

    @property
    def skill_name(self) -> str:
        return self.skill or self.domain

    @field_validator("max_answer_share")
    @classmethod
    def _cap_holds_a_row(cls, share: float | None, info: ValidationInfo) -> float | None:
        size = info.data.get("size")
        if share is not None and size is not None and share * size < 1 - 1e-9:
            raise ValueError(f"{share} of size {size} is less than one row; raise it to at least {1 / size:.4g}")
        return share

    @field_validator("label_quality")
    @classmethod
    def _quality_matches_corruption(cls, quality: str | None, info: ValidationInfo) -> str | None:
        if quality == "clean" and info.data.get("corrupt") is not None:
            raise ValueError("is 'clean' but the entry has `corrupt`: its labels are wrong; remove one of the two")
        return quality

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        known = _reasoning_gym_datasets()
        if task not in known:
            raise ValueError(f"unknown reasoning-gym dataset {task!r}; known: {', '.join(sorted(known))}")
        if task in HASH_ORDER_DEPENDENT_TASKS:
            raise ValueError(f"reasoning-gym's {task!r} generator depends on Python's per-process hash order, "
                             f"so the same seed gives other rows in every process and no run reproduces; "
                             f"pick another task")
        return task

    @field_validator("config")
    @classmethod
    def _valid_config(cls, config: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        task = info.data.get("task")
        if task is None:  # the task itself failed validation; that error is reported already
            return config
        _, config_cls = _reasoning_gym_datasets()[task]
        allowed = {f.name for f in dataclasses.fields(config_cls)} - set(_RESERVED_CONFIG_KEYS)
        reserved = sorted(set(config) & set(_RESERVED_CONFIG_KEYS))
        if reserved:
            verb = "is" if len(reserved) == 1 else "are"
            raise ValueError(f"{', '.join(reserved)} {verb} set by the testbed builder; remove from config")
        unknown = sorted(set(config) - allowed)
        if unknown:
            raise ValueError(
                f"unknown config key(s) {', '.join(map(repr, unknown))} for {task!r}; "
                f"allowed: {', '.join(sorted(allowed))}"
            )
        try:
            instance = config_cls(**config)
            if hasattr(instance, "validate"):
                instance.validate()
        except (AssertionError, TypeError, ValueError) as error:
            raise ValueError(f"invalid config for {task!r}: {error or type(error).__name__}") from None
        try:
            # Some bad configs pass validate() and only fail when an item is drawn.
            _draw_probe(task, config)
        except Exception as error:  # noqa: BLE001 - any failure here is a config error
            raise ValueError(
                f"config for {task!r} fails to generate an example ({type(error).__name__}: {error})"
            ) from None
        return config


class TestbedSpec(BaseModel):
    """A source mixture and a target mixture, plus how the target is split and prompted."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(min_length=1)
    description: str = ""
    seed: int = Field(ge=0)
    """Every generator's seed is derived from this one; the same spec gives the same data."""
    # Entry fields added after testbeds had published results, left out of `content_json` while
    # at their default: a testbed that does not use one keeps the digest its recorded runs carry.
    _LATER_ENTRY_FIELDS: ClassVar[dict[str, Any]] = {"rubric": None}

    def content_json(self) -> str:
        """The spec as JSON for digests (bench records, the build cache): every field, except entry
        fields added later while they hold their default."""
        return self._json(exclude_description=False)

    def data_json(self) -> str:
        """content_json without the description: what makes the data and the model. A bench record
        keeps its digest too, so rewording a testbed's description does not orphan its published runs."""
        return self._json(exclude_description=True)

    def _json(self, exclude_description: bool) -> str:
        unused = {name for name, default in self._LATER_ENTRY_FIELDS.items()
                  if all(getattr(entry, name) == default for entry in (*self.source, *self.target))}
        exclude: dict[str, Any] = {"description": True} if exclude_description else {}
        if unused:
            exclude.update(source={"__all__": unused}, target={"__all__": unused})
        return self.model_dump_json(exclude=exclude or None)
    source: list[MixtureEntry] = Field(min_length=1)
    target: list[MixtureEntry] = Field(min_length=1)
    feedback_fraction: float = Field(gt=0.0, lt=1.0)
    """Share of target data given to the owner as the held-out feedback split; the rest is test."""
    warmup_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Share of each source entry's distinct prompts set aside for the tiny policy's supervised
    warm-up and kept out of the RL pool (0 = the warm-up reuses the RL pool). As in practice, the
    SFT data then differs from the RL prompts: GRPO cannot just sharpen answers it memorised."""
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    """How prompts are rendered for the model (must contain "{prompt}" once)."""
    source_grader: dict[str, Any] | None = None
    """The grader noise of the source: a noisy verifier that rewards the trainer's rollouts
    instead of each row's exact one, e.g. `source_grader = { name = "noisy_flip", flip_rate = 0.2 }`
    (rlvr_core/verifiers/noisy.py; its options are checked here). None: the exact verifier. The
    owner's held-out rows and the final test always keep their exact verifier."""
    summaries: dict[str, list[str]] = Field(default_factory=dict)
    """Named subsets of the target's benchmarks (target `domain`s), each summarised by the mean of
    its benchmarks' accuracies beside the domain-balanced average, e.g. DataFlex's math-heavy
    summary: `math_heavy = ["math_add", "math_sub", "text_count"]`."""

    @field_validator("prompt_template")
    @classmethod
    def _valid_template(cls, template: str) -> str:
        return validate_template(template)

    @field_validator("source_grader")
    @classmethod
    def _known_grader(cls, grader: dict[str, Any] | None) -> dict[str, Any] | None:
        if grader is None:
            return None
        from rlvr_core.verifiers.base import make_verifier

        try:
            make_verifier(grader)
        except ValidationError as error:
            item = error.errors()[0]
            raise ValueError(f"{_field_path(item['loc'])}: {item['msg']}") from None
        return grader

    @field_validator("summaries")
    @classmethod
    def _summaries_name_benchmarks(cls, summaries: dict[str, list[str]], info: ValidationInfo) -> dict[str, list[str]]:
        target = info.data.get("target")
        if target is None:
            return summaries  # the target's own errors are reported already
        benchmarks = {entry.domain for entry in target}
        for name, members in summaries.items():
            if not re.match(_LABEL_PATTERN, name):
                raise ValueError(f"summary name {name!r} must use only letters, digits, _ and -")
            if not members:
                raise ValueError(f"summary {name!r} lists no benchmark; list target domains, e.g. "
                                 f"{sorted(benchmarks)[:2]}")
            unknown = sorted(set(members) - benchmarks)
            if unknown:
                raise ValueError(f"summary {name!r} names {unknown}, which are not target domains; "
                                 f"known: {', '.join(sorted(benchmarks))}")
            if len(set(members)) != len(members):
                raise ValueError(f"summary {name!r} lists a benchmark twice: {members}")
        return summaries

    @field_validator("source")
    @classmethod
    def _one_quality_per_cluster(cls, source: list[MixtureEntry]) -> list[MixtureEntry]:
        # A cluster is the unit every sampler (and the oracle) weighs: one label quality per cluster.
        qualities: dict[str, tuple[int, str]] = {}
        for index, entry in enumerate(source):
            if entry.max_answer_share is not None:
                raise ValueError(f"[{index}]: max_answer_share applies to target entries only (it keeps the "
                                 f"owner's commonest answer rare); remove it from the source")
            first, quality = qualities.setdefault(entry_cluster(entry), (index, entry.quality))
            if quality != entry.quality:
                raise ValueError(f"[{index}]: cluster {entry_cluster(entry)!r} has {quality!r} labels in "
                                 f"source[{first}] and {entry.quality!r} here; give one of them another "
                                 f"domain or difficulty")
        return source

    @field_validator("target")
    @classmethod
    def _one_family_per_benchmark(cls, target: list[MixtureEntry]) -> list[MixtureEntry]:
        families: dict[str, str] = {}
        for index, entry in enumerate(target):
            hidden = [name for name, value in (("corrupt", entry.corrupt), ("label_quality", entry.label_quality),
                                                ("skill", entry.skill or None)) if value is not None]
            if hidden:
                raise ValueError(f"[{index}]: {', '.join(hidden)} apply to source entries only (the owner's "
                                 f"labels are the truth the target is measured by); remove from the target")
            known = families.setdefault(entry.domain, entry.family_name)
            if known != entry.family_name:
                raise ValueError(f"[{index}]: target domain {entry.domain!r} is in family {known!r} in an "
                                 f"earlier entry and {entry.family_name!r} here; give it one family")
        return target


@dataclass(frozen=True)
class TestbedData:
    """The built examples. Shared between callers (builds are cached): do not mutate metadata."""

    source: tuple[Example, ...]
    feedback: tuple[Example, ...]
    test: tuple[Example, ...]
    warmup: tuple[Example, ...] = ()  # the tiny policy's SFT data (warmup_fraction > 0), disjoint from source


def testbed_names() -> list[str]:
    """Names of the built-in testbeds."""
    return sorted(path.stem for path in TESTBED_DIR.glob("*.toml"))


def load_testbed(name_or_path: str | Path) -> TestbedSpec:
    """Load a built-in testbed by name, or a user testbed from a TOML file path.

    Raises TestbedError naming the file and the field (TOML syntax errors, missing fields,
    wrong types, unknown reasoning-gym datasets or config keys).
    """
    text_name = str(name_or_path)
    if text_name in testbed_names():
        path = TESTBED_DIR / f"{text_name}.toml"
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise TestbedError(
                f"testbed {text_name!r} is neither a built-in ({', '.join(testbed_names())}) nor an existing file"
            )
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise TestbedError(f"{path}: cannot read ({type(error).__name__}: {error})") from None
    except tomllib.TOMLDecodeError as error:
        raise TestbedError(f"{path}: TOML syntax error: {error}") from None
    return parse_testbed(data, origin=str(path))


def parse_testbed(data: dict[str, Any], origin: str = "<testbed>") -> TestbedSpec:
    """Validate a decoded testbed; TestbedError lists every problem as "origin: field.path: msg"."""
    try:
        return TestbedSpec.model_validate(data)
    except ValidationError as error:
        problems = [f"{_field_path(item['loc'])}: {_message(item)}" for item in error.errors()]
        raise TestbedError(f"{origin}: " + f"\n{origin}: ".join(problems)) from None


def cluster_of(example: Example) -> str:
    """The example's cluster: "domain:difficulty", or the domain alone without a difficulty."""
    difficulty = example.metadata.get("difficulty", "") if isinstance(example.metadata, dict) else ""
    return f"{example.domain}:{difficulty}" if difficulty else example.domain


def entry_cluster(entry: MixtureEntry) -> str:
    """The cluster id the entry's examples get (cluster_of): "domain:difficulty" or the domain."""
    return f"{entry.domain}:{entry.difficulty}" if entry.difficulty else entry.domain


def has_hidden_labels(spec: TestbedSpec) -> bool:
    """True when some source entry has wrong labels or names its skill apart from its domain:
    then only the oracle's per-cluster weights (skill_cluster_weights) sample the right data."""
    return any(entry.quality == "wrong" or entry.skill_name != entry.domain for entry in spec.source)


def skill_cluster_weights(spec: TestbedSpec) -> dict[str, float]:
    """The oracle's mix (simulation only: it reads the hidden fields): each target family's share
    spread over the clean source clusters whose skill is that family, in proportion to their
    sizes (what sampling the family's prompts uniformly gives). Sorted by cluster; sums to 1."""
    composition = target_composition(spec)
    sizes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for entry in spec.source:
        if entry.quality == "clean" and entry.skill_name in composition:
            sizes[entry.skill_name][entry_cluster(entry)] += entry.size
    missing = sorted(set(composition) - set(sizes))
    if missing:
        raise TestbedError(f"testbed {spec.name!r}: no clean source entry carries the target skill(s) {missing}; "
                           f"the oracle has nothing to sample (set `skill` on an entry)")
    weights: dict[str, float] = defaultdict(float)
    for skill, share in composition.items():
        total = sum(sizes[skill].values())
        for cluster, size in sizes[skill].items():
            weights[cluster] += share * size / total
    return dict(sorted(weights.items()))


def target_composition(spec: TestbedSpec) -> dict[str, float]:
    """Each target family's share of the target examples (sums to 1), sorted by name. Without
    families (the usual testbed) a family is its domain, so this is each target domain's share."""
    totals: dict[str, int] = defaultdict(int)
    for entry in spec.target:
        totals[entry.family_name] += entry.size
    grand_total = sum(totals.values())
    return {domain: totals[domain] / grand_total for domain in sorted(totals)}


def benchmark_families(spec: TestbedSpec) -> dict[str, str]:
    """Target domain (benchmark) -> the family it measures, sorted by benchmark. Without families
    every benchmark is its own family, and the family-balanced average is the plain macro average."""
    return {entry.domain: entry.family_name for entry in sorted(spec.target, key=lambda e: e.domain)}


def build_testbed_data(spec: TestbedSpec) -> TestbedData:
    """Generate the source, feedback and test examples of `spec`, deterministically.

    Each entry's generator seed is derived from (spec.seed, "src"|"tgt", entry index). Target
    prompts that already appear in the source (or earlier in the target) are skipped, so the
    owner's data never overlaps the training data even where a config's prompt space is small.
    The target is split into feedback/test by a seeded shuffle within each domain.
    Builds are cached per spec, so both parties in one process share one build.
    """
    key = spec.content_json()
    cached = _BUILD_CACHE.get(key)
    if cached is None:
        cached = _build(spec)
        while len(_BUILD_CACHE) >= _BUILD_CACHE_SIZE:
            _BUILD_CACHE.pop(next(iter(_BUILD_CACHE)))
        _BUILD_CACHE[key] = cached
    return cached


_BUILD_CACHE: dict[str, TestbedData] = {}  # spec JSON -> build; insertion order = age
_BUILD_CACHE_SIZE = 4


def _build(spec: TestbedSpec) -> TestbedData:
    source: list[Example] = []
    warmup: list[Example] = []
    for index, entry in enumerate(spec.source):
        drawn = _generate(entry, "src", index, _derive_seed(spec.seed, "src", index), avoid=None)
        if entry.quality == "wrong":  # curated SFT data: a wrong-label entry trains RL only
            rl_part, warm_part = _corrupted(drawn, entry, f"source[{index}]"), []
        else:
            rl_part, warm_part = _split_warmup(drawn, spec.warmup_fraction, _derive_seed(spec.seed, "warm", index))
        source.extend(rl_part)
        warmup.extend(warm_part)
    seen_prompts = {question_of(example) for example in source + warmup}  # a rubric's rules aside
    target: list[Example] = []
    capped: set[int] = set()  # positions of rows from entries with max_answer_share
    for index, entry in enumerate(spec.target):
        drawn = _generate(entry, "tgt", index, _derive_seed(spec.seed, "tgt", index), avoid=seen_prompts)
        seen_prompts.update(question_of(example) for example in drawn)
        if entry.answer_cap is not None:
            capped.update(range(len(target), len(target) + len(drawn)))
        target.extend(drawn)
    feedback, test = _split(target, spec.feedback_fraction, _derive_seed(spec.seed, "split", 0), capped)
    return TestbedData(source=tuple(source), feedback=feedback, test=test, warmup=tuple(warmup))


def _corrupted(drawn: list[Example], entry: MixtureEntry, where: str) -> list[Example]:
    """The entry's examples with their answers corrupted (unchanged without `corrupt`). Nothing
    else changes: ids, metadata and clusters look like a clean entry's."""
    if entry.corrupt is None:
        return drawn
    return [dataclasses.replace(example, answer=entry.corrupt.apply(example.answer, where)) for example in drawn]


def _split_warmup(drawn: list[Example], fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """(RL part, warm-up part): a seeded `fraction` of the distinct prompts goes to the warm-up,
    with every copy of a prompt on the same side, so the two never share a prompt."""
    if fraction == 0.0:
        return drawn, []
    prompts = sorted({example.prompt for example in drawn})
    random.Random(seed).shuffle(prompts)
    warm = set(prompts[: round(len(prompts) * fraction)])
    return [e for e in drawn if e.prompt not in warm], [e for e in drawn if e.prompt in warm]


def _generate(entry: MixtureEntry, prefix: str, index: int, seed: int, avoid: set[str] | None) -> list[Example]:
    """Draw `entry.size` examples; with `avoid`, skip prompts in it and duplicates among the draws;
    with `max_answer_share`, skip draws whose answer already holds its share (answer_cap)."""
    import reasoning_gym

    where = f"{'target' if prefix == 'tgt' else 'source'}[{index}]"
    cap = entry.answer_cap
    bounded = avoid is not None or cap is not None
    max_draws = entry.size * _MAX_DRAWS_PER_EXAMPLE if bounded else entry.size
    try:
        dataset = reasoning_gym.create_dataset(entry.task, seed=seed, size=max_draws, **entry.config)
    except Exception as error:  # noqa: BLE001 - reported with the entry it belongs to
        raise TestbedError(f"{where}: reasoning-gym could not create {entry.task!r}: {error}") from None
    examples: list[Example] = []
    taken: set[str] = set()
    held: Counter[str] = Counter()  # accepted rows per answer
    offered: Counter[str] = Counter()  # new prompts per answer, accepted or not (for the refusal)
    for draw in range(max_draws):
        if len(examples) == entry.size:
            break
        try:
            item = dataset[draw]
        except Exception as error:  # noqa: BLE001
            raise TestbedError(
                f"{where}: reasoning-gym failed to generate {entry.task!r} item {draw} "
                f"({type(error).__name__}: {error})"
            ) from None
        prompt = str(item["question"])
        if (avoid is not None and prompt in avoid) or (bounded and prompt in taken):
            continue
        taken.add(prompt)
        answer = str(item["answer"])
        offered[answer.strip()] += 1
        if cap is not None and held[answer.strip()] >= cap:
            continue
        held[answer.strip()] += 1
        example = Example(
            id=f"{prefix}-{entry.task}-{index}-{len(examples)}",
            prompt=prompt,
            answer=answer,
            task=entry.task,
            domain=entry.domain,
            verifier="reasoning_gym",
            metadata={"rg": to_jsonable(item.get("metadata", {})), "difficulty": entry.difficulty},
        )
        if entry.rubric is not None:
            try:
                example = entry.rubric.apply(example, seed)
            except ValueError as error:
                raise TestbedError(f"{where}.rubric.{error}") from None
        examples.append(example)
    if len(examples) < entry.size and cap is not None and sum(offered.values()) >= entry.size:
        reached = _lowest_reachable_share(offered, entry.size)
        raise TestbedError(
            f"{where}.max_answer_share: {entry.max_answer_share} is not reachable: after {max_draws} draws "
            f"the lowest commonest-answer share {entry.size} rows could have is {reached:.3f} (only "
            f"{len(examples)} rows fit under the cap); raise max_answer_share to at least {reached:.3f}, "
            f"lower size or widen the config's answer range"
        )
    if len(examples) < entry.size:
        raise TestbedError(
            f"{where}: only {len(examples)} of {entry.size} "
            f"prompts are new (not in the source or earlier target entries); the config's prompt space is "
            f"too small for this size — lower size or widen the config"
        )
    return examples


def _lowest_reachable_share(offered: Counter[str], size: int) -> float:
    """The smallest commonest-answer share a `size`-row subset of the offered answers can have:
    the least per-answer cap m with sum(min(count, m)) >= size, as a share of size."""
    for cap in range(1, size + 1):
        if sum(min(count, cap) for count in offered.values()) >= size:
            return cap / size
    return 1.0


def _split(target: list[Example], fraction: float, seed: int,
           by_answer: frozenset[int] | set[int] = frozenset()) -> tuple[tuple[Example, ...], tuple[Example, ...]]:
    """Stratified by domain: each domain gives round(n * fraction) examples (at least 1, and at
    least 1 left for test when it has 2+) to feedback. Rows at `by_answer` positions (entries with
    max_answer_share) are stratified by (domain, answer), so both splits keep the answer cap up to
    rounding. Both splits keep generation order."""
    rng = random.Random(seed)
    positions_by_domain: dict[tuple[str, str], list[int]] = defaultdict(list)
    for position, example in enumerate(target):
        answer = example.answer.strip() if position in by_answer else ""
        positions_by_domain[(example.domain, answer)].append(position)
    feedback_positions: set[int] = set()
    for domain in sorted(positions_by_domain):
        positions = positions_by_domain[domain]
        rng.shuffle(positions)
        count = round(len(positions) * fraction)
        if len(positions) >= 2:
            count = min(max(count, 1), len(positions) - 1)
        feedback_positions.update(positions[:count])
    feedback = tuple(example for position, example in enumerate(target) if position in feedback_positions)
    test = tuple(example for position, example in enumerate(target) if position not in feedback_positions)
    return feedback, test


def _derive_seed(seed: int, stream: str, index: int) -> int:
    """A 31-bit seed per (spec seed, stream, entry). reasoning-gym seeds item i with seed + i,
    so consecutive seeds would share items; hashed seeds land far apart."""
    digest = hashlib.sha256(f"{seed}/{stream}/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def to_jsonable(value: Any) -> Any:
    """Convert reasoning-gym metadata to plain JSON types (tuples -> lists, dates -> ISO text...)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((to_jsonable(item) for item in value), key=repr)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return to_jsonable(value.item())
    if hasattr(value, "value") and isinstance(value.value, (str, int)):  # enums
        return value.value
    return str(value)


def _draw_probe(task: str, config: dict[str, Any]) -> None:
    import reasoning_gym

    reasoning_gym.create_dataset(task, seed=0, size=1, **config)[0]


@functools.cache
def _reasoning_gym_datasets() -> dict[str, tuple[type, type]]:
    # Imported on first validation only: reasoning-gym takes seconds to import.
    from reasoning_gym.factory import DATASETS

    return dict(DATASETS)


def _field_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"


def _message(item: dict[str, Any]) -> str:
    message = str(item["msg"]).removeprefix("Value error, ")
    if item["type"] == "missing":
        return "field is missing"
    if item["type"] == "extra_forbidden":
        return "unknown field (check the spelling)"
    return message
