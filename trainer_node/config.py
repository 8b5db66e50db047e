"""The trainer's typed run configuration, loaded from TOML and validated once at the edge.

Every section forbids unknown keys, and every error names the field and how to fix it, e.g.

    grpo.lr: Input should be greater than 0 (got -0.1)
    policy.name: unknown data policy 'uniformm'; known: uniform, ...

Defaults fit the tiny CPU setting (a few-million-parameter model, short answers). The
resolved config is written as JSON next to every run (resolved_config.json).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A config file is invalid; the message lists every bad field with a fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Section):
    """Which policy model to train: a local directory, or the project's tiny model."""

    path: Path | None = None
    """A local model directory (config.json + *.safetensors + tokenizer). Never a hub id."""
    tiny: bool = False
    """Build (or reuse from cache_dir) the tiny policy: tokenizer + SFT on the source data."""
    tiny_spec: dict[str, Any] = Field(default_factory=dict)
    """Overrides of rlvr_core.models.tiny_policy.TinyPolicySpec fields (tiny = true only)."""
    cache_dir: Path = Path(".cache/tiny_policies")
    """Where built tiny policies are cached, keyed by spec and data."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.path is None) == (not self.tiny):
            raise ValueError("set exactly one of `path = \"DIR\"` or `tiny = true`")
        if self.tiny_spec and not self.tiny:
            raise ValueError("tiny_spec is only used with tiny = true; remove it or set tiny = true")
        return self


class DataConfig(_Section):
    testbed: str = "default"
    """A testbed name (rlvr_core.tasks.testbed) or a path to a testbed TOML file."""
    eval_size: int = Field(default=64, ge=0)
    """Source examples held out of the training pool for `train`'s local eval (0 = none)."""
    train_on_feedback_split: bool = False
    """The "target-mix" diagnostic (simulate only): add the owner's feedback split to the
    training pool. It breaks the two-party privacy model on purpose, as an upper reference."""


class PolicyConfig(_Section):
    name: str = "uniform"
    """A registered data policy (trainer_node.policies)."""
    batch_size: int = Field(default=8, gt=0)
    """Prompts per training batch (B)."""
    rollouts_per_prompt: int = Field(default=16, ge=2)
    """Rollouts per prompt (n); GRPO needs at least 2 to compare."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Policy-specific options, passed through as PolicySettings.options."""

    @field_validator("name")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        from trainer_node.policies.base import policy_names

        known = policy_names()
        if name not in known:
            raise ValueError(f"unknown data policy {name!r}; known: {', '.join(known)}")
        return name


class GrpoConfig(_Section):
    advantage: str = "grpo"
    """'grpo' (r - mean) / std, or 'dr_grpo' r - mean."""
    loss: str = "ppo_clip"
    loss_aggregation: str = "token_mean"
    """'token_mean' (DAPO token-level) or 'seq_mean' (per-sequence mean, then mean)."""
    eps_low: float = Field(default=0.2, gt=0, lt=1)
    eps_high: float = Field(default=0.28, gt=0)
    kl_coef: float = Field(default=0.0, ge=0)
    """> 0 loads a frozen reference copy of the initial model and adds k3 KL."""
    lr: float = Field(default=3e-4, gt=0)
    """Tiny CPU policy: 2e-4 already collapses sub:easy within 100 steps on the default testbed."""
    weight_decay: float = Field(default=0.01, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = Field(default=1e-8, gt=0)
    grad_accum_steps: int = Field(default=1, gt=0)
    """Micro-batches per optimizer step; the accumulated gradient equals the full-batch one."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    ppo_epochs: int = Field(default=1, gt=0)
    """Passes over each batch. 1 = on-policy (ratio == 1)."""
    mini_batches: int = Field(default=1, gt=0)
    """Optimizer steps per pass; > 1 makes later mini-batches off-policy (clipping matters)."""
    overlong_buffer: int = Field(default=0, ge=0)
    """DAPO soft overlong penalty window in tokens (0 = off)."""
    overlong_penalty_factor: float = Field(default=1.0, ge=0)
    adv_eps: float = Field(default=1e-6, gt=0)
    lookahead: str = "adamw"
    """How lookahead candidates (L2RR) take their one step: a registered lookahead optimizer
    (trainer_node.grpo.lookahead), 'adamw' (a copy of the AdamW state) or 'sgd'."""
    lookahead_lr: float | None = Field(default=None, gt=0)
    """Step size of lookahead candidates; None = grpo.lr."""

    @field_validator("lookahead")
    @classmethod
    def _known_lookahead(cls, name: str) -> str:
        from trainer_node.grpo.lookahead import get_lookahead_optimizer

        get_lookahead_optimizer(name)  # raises, listing the known optimizers
        return name

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, name: str) -> str:
        from trainer_node.grpo.advantages import advantage_names

        if name not in advantage_names():
            raise ValueError(f"unknown advantage estimator {name!r}; known: {', '.join(advantage_names())}")
        return name

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, name: str) -> str:
        from trainer_node.grpo.losses import loss_names

        if name not in loss_names():
            raise ValueError(f"unknown policy loss {name!r}; known: {', '.join(loss_names())}")
        return name

    @field_validator("loss_aggregation")
    @classmethod
    def _known_aggregation(cls, name: str) -> str:
        from trainer_node.grpo.losses import aggregation_names

        if name not in aggregation_names():
            raise ValueError(f"unknown loss aggregation {name!r}; known: {', '.join(aggregation_names())}")
        return name

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError("both betas must be in [0, 1), e.g. [0.9, 0.999]")
        return betas


class RolloutConfig(_Section):
    engine: str = "transformers"
    """A registered generation engine (rlvr_core.engines.registry)."""
    max_new_tokens: int = Field(default=8, gt=0)
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature (> 0: GRPO needs diverse rollouts). Logprobs use the same one."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    options: dict[str, Any] = Field(default_factory=dict)
    """Engine-specific options passed to build_engine."""


class RunConfig(_Section):
    steps: int = Field(default=300, gt=0)
    seed: int = 0
    out_dir: Path = Path("runs/train")
    eval_every: int = Field(default=0, ge=0)
    """Local eval on the held-out source slice every k steps (0 = only before and after)."""
    save_every: int = Field(default=0, ge=0)
    """Checkpoint every k steps (0 = only at the end)."""
    device: str = "cpu"

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        if device != "cpu" and not device.startswith("cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
        return device


class SelectionConfig(_Section):
    """Checkpoint selection by target feedback (the L2RR paper's Table 12), any method.

    Every `every` steps (and at the end) the live model becomes a candidate; after training,
    ONE multi-candidate release on the owner's feedback split picks the best, charged like
    any release (one query is kept back from the sampler's budget for it)."""

    every: int = Field(default=0, ge=0)
    """Candidate interval in steps (0 = off: the final model is reported)."""
    max_candidates: int = Field(default=8, ge=2)
    """At most this many candidates (evenly thinned, the final model always kept); the owner
    caps candidates per query (evaluation.max_candidates_per_query, default 8)."""


class FeedbackConfig(_Section):
    """A remote target owner to learn from (two-party deployment). Absent = no feedback."""

    target: str
    """The owner's address, HOST:PORT."""
    ca_cert: Path
    """The OWNER organization's CA certificate (verifies the owner's server certificate)."""
    client_cert: Path
    """This trainer's client certificate, issued by a CA the owner trusts."""
    client_key: Path
    server_name: str | None = None
    """TLS name to expect when `target` is an address not named in the server certificate."""
    deadline_s: float = Field(default=30.0, gt=0)
    evaluate_deadline_s: float = Field(default=600.0, gt=0)
    max_attempts: int = Field(default=5, ge=1)
    """Attempts for UNAVAILABLE only; RESOURCE_EXHAUSTED is never retried."""
    samples_per_prompt: int = Field(default=1, ge=1)
    temperature: float = Field(default=0.0, ge=0)
    """Decoding of the owner's evaluations (0 = greedy, lowest variance)."""
    min_interval: int = Field(default=1, ge=1)
    """Never query more often than every this many steps (budget pacing may space queries more)."""
    final_release: bool = True
    """Ask the owner for the final checkpoint's held-out accuracy (one release, charged)."""

    @field_validator("target")
    @classmethod
    def _host_port(cls, target: str) -> str:
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"must be HOST:PORT, got {target!r}")
        return target

    def client_settings(self):
        from trainer_node.feedback.client import ClientSettings

        return ClientSettings(
            target=self.target, ca_cert=self.ca_cert, client_cert=self.client_cert, client_key=self.client_key,
            server_name=self.server_name, deadline_s=self.deadline_s,
            evaluate_deadline_s=self.evaluate_deadline_s, max_attempts=self.max_attempts,
        )


class TrainConfig(_Section):
    model: ModelConfig
    data: DataConfig = DataConfig()
    policy: PolicyConfig = PolicyConfig()
    grpo: GrpoConfig = GrpoConfig()
    rollout: RolloutConfig = RolloutConfig()
    run: RunConfig = RunConfig()
    feedback: FeedbackConfig | None = None
    selection: SelectionConfig = SelectionConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> TrainConfig:
        if self.grpo.overlong_buffer >= self.rollout.max_new_tokens:
            raise ValueError(
                f"grpo.overlong_buffer ({self.grpo.overlong_buffer}) must be smaller than "
                f"rollout.max_new_tokens ({self.rollout.max_new_tokens}); lower it or set 0 to disable"
            )
        return self

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def save_resolved(self, run_dir: Path) -> Path:
        """Write the fully resolved config (defaults filled in) as run_dir/resolved_config.json."""
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "resolved_config.json"
        path.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        return path


def _format_errors(error: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key; remove it or check the spelling (see trainer_node/configs/train_default.toml)"
        elif item["type"] == "missing":
            message = "required; add it to the config"
        elif "input" in item and not isinstance(item["input"], dict):
            message = f"{message} (got {item['input']!r})"
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *sections, key = dotted.split(".")
    node = raw
    for section in sections:
        node = node.setdefault(section, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot override {dotted!r}: {section!r} is not a section")
    node[key] = value


def parse_config(raw: dict[str, Any], overrides: dict[str, Any] | None = None, source: str = "") -> TrainConfig:
    """Validate a raw dict (as read from TOML) plus dotted overrides such as {'run.steps': 5}."""
    raw = json.loads(json.dumps(raw, default=str))  # deep copy; TOML values are JSON-able
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(raw, dotted, value)
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(_format_errors(error, source or "(dict)")) from None


def load_config(path: Path | str, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read and validate a TOML run config. Raises ConfigError naming every bad field."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from None
    return parse_config(raw, overrides, source=str(path))
