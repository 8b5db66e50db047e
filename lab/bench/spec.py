"""What a benchmark runs: the spec (TOML, validated once) and the planned runs it expands to.

A spec lists methods (a label, a registered data policy, its options, optional update-seam
rules, optional config overrides), the seeds, the testbeds and the step count. `plan_runs` crosses them into one
`PlannedRun` per (testbed, method, seed): every method gets exactly the same seeds and
testbeds, which is what makes the paired differences in stats.py valid.

Each planned run carries its fully resolved `trainer-node simulate` config (the packaged
simulate defaults, then the spec's `config`, then the method's `config`, then the bench's own
keys) and a config hash over it, so a resumed bench re-runs exactly the runs whose inputs
changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lab.configs import simulate_defaults_path
from lab.policies import fill_simulation_options
from trainer_node.config import ConfigError, parse_config

PROFILE_DIR = Path(str(resources.files("lab.bench") / "profiles"))
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
# Keys the bench sets itself for every run; a spec may not override them through `config`.
# (A policy's own options come from the method's `options`; `config` may set only the batch
# shape every policy shares, see _check_overrides.)
_BENCH_OWNED = {("policy", "name"), ("data", "testbed"), ("run", "seed"), ("run", "steps"),
                ("run", "out_dir"), ("grpo", "selection"), ("grpo", "reweighting"), ("grpo", "coefficients")}
# The DataFlex-RL intervention families (seed 001) a method row can belong to.
FAMILIES = ("selection", "reweighting", "mixture")


class BenchSpecError(ConfigError):
    """A bench spec is invalid; the message names every bad field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MethodSpec(_Strict):
    """One row of the tables: a data policy with fixed options, optionally with update-seam rules
    (a selection rule, a reweighting rule: trainer_node/grpo/update_seam.py). A DataFlex-RL
    selection or reweighting configuration is `selection = "gfpo"` (policy uniform, the default);
    a mixture is a data policy (`policy = "reward_gap"`); a preset may bundle a policy and rules."""

    label: str
    """Unique name of the row; also a directory name (letters, digits, _ . + -)."""
    policy: str = "uniform"
    """A registered data policy (trainer_node.policies, lab.policies): uniform, dapo, greso, ar3po, l2rr, oracle,
    static, reward_gap, dump_ucb, tscl. (The target-mix diagnostic is uniform with
    config = { data = { train_on_feedback_split = true } }.)"""
    options: dict[str, Any] = Field(default_factory=dict)
    """The policy's options: they become fields of the simulate config's [policy] table, typed by
    the policy's registered options model (a typo fails when the spec loads)."""
    selection: str | dict[str, Any] | None = None
    """A registered selection rule (difffilter, maxvar, gfpo, topk) or a table with its `name` and
    options; it becomes the run's grpo.selection."""
    reweighting: str | dict[str, Any] | None = None
    """A registered reweighting rule (ar, per, softmax, diffband) or a table; the run's grpo.reweighting."""
    coefficients: str | dict[str, Any] | None = None
    """A registered coefficient module (setgrpo, docs/SETGRPO.md) or a table with its options (an
    ablation: { name = "setgrpo", set_shape = "sphere" }); the run's grpo.coefficients."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Extra simulate-config overrides as nested tables, e.g. {grpo = {lr = 1e-4}}."""
    no_dp: bool | None = None
    """This row's owner releases exact accuracy (True) or DP-noised (False); None = the spec's no_dp.
    One table can then hold a method with and without DP noise, paired by seed."""
    epsilon: float | None = Field(default=None, gt=0)
    """This row's owner privacy budget per run (simulate --epsilon); None = the spec's epsilon."""
    group: Literal["main", "ablation", "sweep", "diagnostic"] = "main"
    """Which table the row goes to: main = Table 1, ablation = Table 2, sweep = the lambda figure,
    diagnostic = references and variants (oracle, target-mix, estimators, checkpoint selection)."""

    @field_validator("label")
    @classmethod
    def _path_safe(cls, label: str) -> str:
        if not _LABEL.match(label):
            raise ValueError(f"label {label!r} must start with a letter or digit and use only letters, digits, _ . + -")
        return label

    @field_validator("policy")
    @classmethod
    def _registered(cls, name: str) -> str:
        from trainer_node.policies.base import policy_names

        if name not in policy_names():
            raise ValueError(f"unknown data policy {name!r}; known: {', '.join(policy_names())}")
        return name

    @field_validator("options")
    @classmethod
    def _typed_options(cls, options: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        policy = info.data.get("policy")
        if policy is None:
            return options  # the policy's own error is reported already
        if "name" in options:
            raise ValueError("`name` is the method's `policy`; remove it from options")
        from trainer_node.policies.base import parse_policy_options

        parse_policy_options({**options, "name": policy})  # errors read methods[i].options.<key>
        return options

    @field_validator("selection", "reweighting", "coefficients")
    @classmethod
    def _registered_rule(cls, value: str | dict[str, Any] | None, info: ValidationInfo) -> Any:
        if value is None:
            return None
        from trainer_node.grpo.update_seam import parse_rule_options

        parse_rule_options(info.field_name, value)  # errors read methods[i].selection.<key>
        return value

    @field_validator("config")
    @classmethod
    def _not_bench_owned(cls, config: dict[str, Any]) -> dict[str, Any]:
        _check_overrides(config)
        return config

    def rule_tables(self) -> dict[str, dict[str, Any]]:
        """The run's grpo.selection / grpo.reweighting tables (only those this method sets)."""
        tables = {}
        for seam in ("coefficients", "selection", "reweighting"):
            value = getattr(self, seam)
            if value is not None:
                tables[seam] = {"name": value} if isinstance(value, str) else json.loads(json.dumps(value))
        return tables

    def family(self) -> str | None:
        """The DataFlex-RL family of this row, from the registries' capabilities: a reweighting
        rule, else a selection rule, else a policy that mixes domains; None: a baseline or reference."""
        from trainer_node.policies.base import policy_class

        if self.reweighting is not None:
            return "reweighting"
        if self.selection is not None:
            return "selection"
        return getattr(policy_class(self.policy), "intervention_family", None)

    @model_validator(mode="after")
    def _sweep_has_a_parameter(self) -> MethodSpec:
        from trainer_node.policies.base import policy_options_model

        if self.group == "sweep" and policy_options_model(self.policy).sweep_parameter is None:
            raise ValueError(f"group = \"sweep\" varies a policy's sweep parameter (L2RR: lambda_waste); "
                             f"policy {self.policy!r} has none")
        return self


class BenchSpec(_Strict):
    """A whole benchmark: methods x seeds x testbeds, each run for `steps` GRPO steps."""

    name: str = "bench"
    methods: list[MethodSpec] = Field(min_length=1)
    seeds: list[int] = Field(min_length=1)
    """Matched seeds: seed s is the same initial policy and source data order for every method."""
    testbeds: list[str] = Field(default_factory=lambda: ["default"], min_length=1)
    steps: int = Field(gt=0)
    control: str = "uniform"
    """Label of the method every other one is compared with (paired differences, RO ratio)."""
    no_dp: bool = False
    """Pass --no-dp to every run (exact owner releases)."""
    epsilon: float | None = Field(default=None, gt=0)
    """The owner's total privacy budget per run (simulate --epsilon); None = simulate's default."""
    owners: int = Field(default=1, ge=1)
    """Target owners per run: > 1 runs `simulate --owners N` (Flower's simulation runtime, one owner
    per target domain; a method picks its aggregation with config = { owners = {...} })."""
    workers: int | None = Field(default=None, ge=1)
    """Concurrent runs; default max(1, cpu_count // 2) (a run is two processes: trainer + owner)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Simulate-config overrides for every method (a method's own `config` wins)."""
    confidence: float = Field(default=0.95, gt=0, lt=1)
    bootstrap_resamples: int = Field(default=10_000, ge=100)
    bootstrap_seed: int = 0
    family_controls: dict[str, str] = Field(default_factory=dict)
    """Second controls per DataFlex-RL family, e.g. { mixture = "static" }: that family's rows are
    also paired against this label (adaptive mixtures against the fixed equal mixture)."""

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be unique, got {seeds}")
        return seeds

    @field_validator("testbeds")
    @classmethod
    def _known_testbeds(cls, testbeds: list[str]) -> list[str]:
        from rlvr_core.tasks.testbed import testbed_names

        if len(set(testbeds)) != len(testbeds):
            raise ValueError(f"testbeds must be unique, got {testbeds}")
        for testbed in testbeds:
            if testbed not in testbed_names() and not Path(testbed).is_file():
                raise ValueError(f"testbed {testbed!r} is neither a built-in ({', '.join(testbed_names())}) nor a file")
        return testbeds

    @field_validator("config")
    @classmethod
    def _not_bench_owned(cls, config: dict[str, Any]) -> dict[str, Any]:
        _check_overrides(config)
        return config

    @model_validator(mode="after")
    def _labels(self) -> BenchSpec:
        labels = [m.label for m in self.methods]
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        if duplicates:
            raise ValueError(f"methods: duplicate label(s) {', '.join(duplicates)}; every label must be unique")
        if self.control not in labels:
            raise ValueError(f"control: {self.control!r} is not a method label; labels: {', '.join(labels)}")
        for family, label in self.family_controls.items():
            if family not in FAMILIES:
                raise ValueError(f"family_controls: {family!r} is not a family; families: {', '.join(FAMILIES)}")
            if label not in labels:
                raise ValueError(f"family_controls.{family}: {label!r} is not a method label; labels: "
                                 f"{', '.join(labels)}")
        return self

    def resolved_workers(self) -> int:
        return self.workers or default_workers()

    def method(self, label: str) -> MethodSpec:
        return next(m for m in self.methods if m.label == label)


def default_workers() -> int:
    """Concurrent runs sized to the machine: each run is a trainer and an owner process."""
    return max(1, (os.cpu_count() or 1) // 2)


def _shared_policy_keys() -> set[str]:
    """[policy] keys every data policy takes (the batch shape); `name` is the bench's."""
    from trainer_node.policies.options import PolicyOptions

    return set(PolicyOptions.model_fields) - {"name"}


def _check_overrides(config: dict[str, Any]) -> None:
    for section, value in config.items():
        if not isinstance(value, dict):
            # ValueError, not TypeError: pydantic turns only ValueError into a field error.
            raise ValueError(f"{section!r} must be a table of simulate-config keys, e.g. [config.{section}]")  # noqa: TRY004
        for key in value:
            if (section, key) in _BENCH_OWNED:
                raise ValueError(f"{section}.{key} is set by the bench for every run; use the spec's own field instead")
            if section == "policy" and key not in _shared_policy_keys():
                raise ValueError(f"policy.{key} is an option of one policy; set it in the method's `options` "
                                 f"(config may set only {', '.join(sorted(_shared_policy_keys()))})")


# --- loading -----------------------------------------------------------------------------------

def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_spec(raw: dict[str, Any], source: str = "(dict)") -> BenchSpec:
    """Validate a decoded spec. BenchSpecError lists every bad field, e.g. `methods[1].policy: ...`."""
    try:
        return BenchSpec.model_validate(raw)
    except ValidationError as error:
        lines = [f"invalid bench spec {source}:"]
        for item in error.errors():
            message = item["msg"].removeprefix("Value error, ")
            if item["type"] == "extra_forbidden":
                message = "unknown key; remove it or check the spelling (see lab/bench/profiles/full.toml)"
            elif item["type"] == "missing":
                message = "required; add it to the spec"
            # Whole-spec checks (control, duplicate labels) already start with the field name.
            lines.append(f"  {_field_path(item['loc'])}: {message}" if item["loc"] else f"  {message}")
        raise BenchSpecError("\n".join(lines)) from None


def load_spec(path: Path | str) -> BenchSpec:
    """Read and validate a TOML bench spec."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise BenchSpecError(f"bench spec {path} does not exist") from None
    except tomllib.TOMLDecodeError as error:
        raise BenchSpecError(f"bench spec {path} is not valid TOML: {error}") from None
    return parse_spec(raw, source=str(path))


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load_profile(name: str) -> BenchSpec:
    """A built-in spec: `quick` (a smoke-scale comparison) or `full` (the paper's tables)."""
    if name not in profile_names():
        raise BenchSpecError(f"unknown profile {name!r}; known: {', '.join(profile_names())}")
    return load_spec(PROFILE_DIR / f"{name}.toml")


# --- planning ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlannedRun:
    """One simulate run of the bench, with its fully resolved config."""

    testbed: str
    label: str
    policy: str
    seed: int
    steps: int
    no_dp: bool
    config: dict[str, Any]
    """The simulate config written for this run (no run.out_dir: the command's --out sets it)."""
    epsilon: float | None = None
    owners: int = 1

    @property
    def testbed_key(self) -> str:
        return testbed_key(self.testbed)

    @property
    def run_id(self) -> str:
        return f"{self.testbed_key}__{self.label}__seed{self.seed}"

    def run_dir(self, out: Path) -> Path:
        return Path(out) / "runs" / self.testbed_key / self.label / f"seed{self.seed}"

    @property
    def config_hash(self) -> str:
        """sha256 of the canonical (sorted-key JSON) run inputs: config, seed, testbed, steps, DP, epsilon."""
        canonical = json.dumps(
            {"config": self.config, "policy": self.policy, "seed": self.seed, "testbed": self.testbed,
             "steps": self.steps, "no_dp": self.no_dp, "epsilon": self.epsilon,
             **({"owners": self.owners} if self.owners > 1 else {})},
            sort_keys=True, separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


def testbed_key(testbed: str) -> str:
    """A directory-safe name: the built-in name, or a file's stem plus a short path hash."""
    from rlvr_core.tasks.testbed import testbed_names

    if testbed in testbed_names():
        return testbed
    digest = hashlib.sha256(str(Path(testbed).resolve()).encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', Path(testbed).stem)}-{digest}"


def simulate_defaults() -> dict[str, Any]:
    """The packaged `trainer-node simulate` defaults, as a dict."""
    return tomllib.loads(simulate_defaults_path().read_text())


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(base))
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = json.loads(json.dumps(value))
    return out


def run_config(spec: BenchSpec, method: MethodSpec, testbed: str, seed: int) -> dict[str, Any]:
    """Defaults < spec.config < method.config < the bench's own keys (policy, testbed, seed, steps)."""
    config = _merge(_merge(simulate_defaults(), spec.config), method.config)
    config = _merge(config, {"data": {"testbed": testbed}, "run": {"seed": seed, "steps": spec.steps}})
    config.setdefault("grpo", {}).update(method.rule_tables())
    # [policy] is the batch shape from defaults and `config`, then the method's own options; the
    # policy-specific keys of another table never leak in (replace, never merge).
    shared = {k: v for k, v in config.get("policy", {}).items() if k in _shared_policy_keys()}
    config["policy"] = {**shared, "name": method.policy, **json.loads(json.dumps(method.options))}
    config = fill_simulation_options(config)  # as simulate does: the hash covers what the run uses
    config["run"].pop("out_dir", None)
    return config


def plan_runs(spec: BenchSpec) -> list[PlannedRun]:
    """Every (testbed, method, seed), each config validated now so a typo fails before any run."""
    runs: list[PlannedRun] = []
    for index, method in enumerate(spec.methods):
        for testbed in spec.testbeds:
            config = run_config(spec, method, testbed, spec.seeds[0])
            try:
                parse_config(config, source=f"for method {method.label!r}")
            except ConfigError as error:
                problems = str(error).split("\n", 1)[-1]
                raise BenchSpecError(
                    f"invalid bench spec: methods[{index}] ({method.label}) makes an invalid simulate config "
                    f"(check `config` of the spec and of the method):\n{problems}"
                ) from None
            for seed in spec.seeds:
                runs.append(PlannedRun(
                    testbed=testbed, label=method.label, policy=method.policy, seed=seed, steps=spec.steps,
                    no_dp=spec.no_dp if method.no_dp is None else method.no_dp,
                    config=run_config(spec, method, testbed, seed),
                    epsilon=spec.epsilon if method.epsilon is None else method.epsilon,
                    owners=spec.owners,
                ))
    return runs
