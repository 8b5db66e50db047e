"""The owner's configuration: one TOML file, validated once at the edge.

Built on the config edge both nodes share (rlvr_core/configuration.py): every error names the
setting and says how to fix it, e.g. ``privacy.delta: must be in (0, 1); got 2``. Relative
paths are resolved against the folder of the config file, so a node folder can be moved as a
whole. Each default is defined once, here: `target-owner-node init` and `launch` read theirs
from these models (`rlvr_core.configuration.default_of(PrivacyConfig, "epsilon_budget")`).

The DP noise multiplier is deliberately NOT a setting: it is derived from
(epsilon_budget, delta, sample_rate, planned_releases) by calibration, so the owner states
the guarantee they want and the node works out the noise (see `PrivacyConfig`).
"""

from __future__ import annotations

import ipaddress
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from rlvr_core.configuration import (
    ConfigError,  # noqa: F401 - re-exported: callers catch it from here
    ConfigPath,
    Section,
    config_dir,
    load_toml,
    validate,
)
from rlvr_core.differences import ANSWER_FIELD, DEFAULT_ANSWER_TEMPLATE
from rlvr_core.tasks.prompting import DEFAULT_PROMPT_TEMPLATE, validate_template
from rlvr_core.tasks.rendering import CHAT_FORMATS, Rendering, RenderingError, read_chat_template
from rlvr_core.verifiers import get_verifier, verifier_names

PER_EXAMPLE = "per_example"
DEFAULT_DIFFERENCE_METRICS = ("answer_probability", "importance", "log_ratio")
STATE_MARKER_NAME = ".target-owner-node-state.json"  # see target_owner_node.state_marker


REFERENCE = "`target-owner-node init`"  # writes a config with every section: where unknown-key errors point


class DataConfig(Section):
    heldout_path: ConfigPath = Field(
        description="JSONL or parquet file of held-out examples (the private feedback split)."
    )
    test_path: ConfigPath | None = Field(
        default=None,
        description="Optional final test split (exact, not charged); served only if test_split_enabled.",
    )
    test_split_enabled: bool = Field(
        default=False,
        description="Serve SPLIT_TEST: exact accuracy with no privacy guarantee, for simulation and "
        "benchmarks only. Requires test_path and test_domains.",
    )
    test_domains: list[str] | None = Field(
        default=None,
        description="The declared, public domain names of the test split (GetInfo publishes them and "
        "only they appear as per-domain keys); every test row's domain must be one of them.",
    )
    min_heldout_size: int = Field(
        default=100, description="The node refuses to serve a smaller held-out set."
    )
    task_description: str = Field(default="", description="Public task card shown to trainers by GetInfo.")
    answer_format: str = Field(default="", description="Public description of the expected answer format.")
    prompt_template: str = Field(
        default=DEFAULT_PROMPT_TEMPLATE,
        description="How each held-out prompt is rendered; contains {prompt} once. With a chat rendering it "
        "fills the user turn.",
    )
    chat_format: str | None = Field(
        default=None,
        description="Render each prompt as a chat with a built-in format (rlvr_core.tasks.rendering."
        f"CHAT_FORMATS: {', '.join(CHAT_FORMATS)}): the owner's choice, published in GetInfo. The owner never "
        "runs a chat template that came with an upload.",
    )
    chat_template_path: ConfigPath | None = Field(
        default=None,
        description="Instead of chat_format: a Jinja chat template file in the owner's own folder (sandboxed; it "
        "gets `messages` and `add_generation_prompt`; write special tokens literally). Published in GetInfo.",
    )
    verifier: str = Field(
        default="per_example",
        description="'per_example' (each row names its verifier) or one registered verifier applied to every "
        "row: a built-in or an installed plug-in (entry-point group target_feedback.verifiers). An exact one: "
        "the test split is always scored exactly.",
    )
    feedback_verifier: str | dict[str, Any] | None = Field(
        default=None,
        description="The held-out (feedback) split's verifier when it differs from `verifier`, e.g. a noisy "
        "grader ('noisy_flip', 'partial_checks': rlvr_core/verifiers/noisy.py) whose draws are keyed by "
        "(seed, row, sample): a registered name, or a table with its options, e.g. { name = \"noisy_flip\", "
        "flip_rate = 0.1 }; None: `verifier`. Private: GetInfo declares `verifier`.",
    )
    answer_template: str = Field(
        default=DEFAULT_ANSWER_TEMPLATE,
        description="How a row's reference answer is written as a completion for the answer metrics of "
        "difference releases ('answer_probability'): {answer} once, replaced by the answer; EOS follows. "
        "The default suits a prompt ending in 'Answer:'. Public: GetInfo publishes it.",
    )

    _chat_template: str = PrivateAttr(default="")

    @field_validator("min_heldout_size")
    @classmethod
    def _min_size(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1; got {v}")
        return v

    @field_validator("prompt_template")
    @classmethod
    def _template(cls, v: str) -> str:
        return validate_template(v)

    @field_validator("chat_format")
    @classmethod
    def _chat_format(cls, v: str | None) -> str | None:
        if v is not None and v not in CHAT_FORMATS:
            raise ValueError(f"must be one of {', '.join(CHAT_FORMATS)}; got {v!r}")
        return v

    @model_validator(mode="after")
    def _read_chat_template(self) -> DataConfig:
        if self.chat_format is not None and self.chat_template_path is not None:
            raise ValueError("chat_format and chat_template_path: set at most one (a built-in format, or your own "
                             "template file)")
        if self.chat_template_path is not None:
            try:
                self._chat_template = read_chat_template(self.chat_template_path)
            except RenderingError as error:
                raise ValueError(f"chat_template_path: {error}") from None
        return self

    def rendering(self) -> Rendering:
        """How held-out prompts are rendered (the owner's choice; GetInfo publishes it)."""
        if self.chat_format is not None:
            return Rendering.chat(self.chat_format, self.prompt_template)
        if self._chat_template:
            return Rendering(self.prompt_template, self._chat_template)
        return Rendering(self.prompt_template)

    @field_validator("verifier")
    @classmethod
    def _verifier(cls, v: str) -> str:
        choices = [PER_EXAMPLE, *verifier_names()]
        if v not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}; got {v!r}")
        if v != PER_EXAMPLE and get_verifier(v).noisy:
            raise ValueError(f"{v!r} is a noisy grader and the test split is always scored exactly; name an exact "
                             "verifier here and the noisy one in data.feedback_verifier")
        return v

    @field_validator("feedback_verifier")
    @classmethod
    def _feedback_verifier(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(v, str) and v not in verifier_names():
            raise ValueError(f"must be a registered verifier ({', '.join(verifier_names())}) or unset; got {v!r}")
        if isinstance(v, dict):
            from rlvr_core.verifiers.base import make_verifier

            make_verifier(v)  # a ValidationError located at the bad option: data.feedback_verifier.<option>
        return v

    @field_validator("answer_template")
    @classmethod
    def _answer_template(cls, v: str) -> str:
        if v.count(ANSWER_FIELD) != 1:
            raise ValueError(f"must contain {ANSWER_FIELD} exactly once (where the answer goes); got {v!r}")
        return v

    @field_validator("test_domains")
    @classmethod
    def _domains(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            if any(not name.strip() for name in v):
                raise ValueError("every domain name must be a non-empty string")
            if len(set(v)) != len(v):
                raise ValueError("domain names must be unique")
        return v

    @model_validator(mode="after")
    def _test_split_needs_path_and_domains(self) -> DataConfig:
        if self.test_split_enabled and self.test_path is None:
            raise ValueError("test_split_enabled = true requires data.test_path (the test split file); set it, "
                             "or set data.test_split_enabled = false")
        if self.test_split_enabled and not self.test_domains:
            raise ValueError("test_split_enabled = true requires data.test_domains (the declared, public list "
                             "of the test rows' domain names, e.g. [\"add\", \"count\"])")
        return self


class EvaluationConfig(Section):
    engine: str = Field(
        default="transformers", description="Generation engine name (rlvr_core.engines.registry)."
    )
    device: str = Field(
        default="cpu", description="Device the evaluation worker uses, e.g. 'cpu' or 'cuda:0'."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Weights dtype."
    )
    max_new_tokens: int = Field(default=256, description="Cap on DecodingSettings.max_new_tokens.")
    max_prompt_tokens: int = Field(
        default=128,
        description="PUBLIC prompt width: every rendered prompt is left-truncated or left-padded to exactly "
        "this many tokens (fixed shapes: time and memory never depend on which rows were drawn). Choose it "
        "from the public task card, not from the held-out rows; GetInfo publishes it.",
    )
    max_samples_per_prompt: int = Field(
        default=8, description="Cap on DecodingSettings.samples_per_prompt (k)."
    )
    max_candidates_per_query: int = Field(default=8, description="Most checkpoints one Evaluate may compare.")
    batch_size: int = Field(
        default=16, description="Prompts per generation batch in the worker (every batch is this full)."
    )
    timeout_s: float = Field(
        default=1800.0, description="Wall-clock limit for one Evaluate; the worker is restarted past it."
    )
    model_cache_size: int = Field(default=2, description="Loaded models the worker keeps (LRU).")
    min_response_s: float = Field(
        default=0.0,
        description="Optional floor on the wall time of a feedback Evaluate: the reply is held until this "
        "many seconds after the request arrived. A second timing defence for engines without fixed shapes "
        "(vLLM); 0 = off.",
    )
    difference_metrics: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DIFFERENCE_METRICS),
        description="The per-row metrics of the difference releases this node serves "
        "(RELEASE_KIND_ACCURACY_DIFFERENCE: each candidate's clipped accuracy change from a base, noise "
        "calibrated to the request's clip; rlvr_core/differences.py): registered names, e.g. "
        "'answer_probability', 'importance', 'log_ratio'. [] = accuracy releases only. Needs an engine that "
        "scores given completions (transformers). GetInfo publishes them.",
    )
    max_difference_clip: float = Field(
        default=1.0,
        description="The largest per-row clip a difference release may ask for (the noise std on each "
        "released difference is the accuracy noise std times the request's clip). Public.",
    )

    @field_validator(
        "max_new_tokens",
        "max_prompt_tokens",
        "max_samples_per_prompt",
        "max_candidates_per_query",
        "batch_size",
        "model_cache_size",
    )
    @classmethod
    def _positive_int(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1; got {v}")
        return v

    @field_validator("timeout_s")
    @classmethod
    def _positive_time(cls, v: float) -> float:
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"must be a positive number of seconds; got {v}")
        return v

    @field_validator("min_response_s")
    @classmethod
    def _non_negative_time(cls, v: float) -> float:
        if not (v >= 0 and math.isfinite(v)):
            raise ValueError(f"must be 0 (off) or a positive number of seconds; got {v}")
        return v

    @field_validator("difference_metrics")
    @classmethod
    def _difference_metrics(cls, v: list[str]) -> list[str]:
        from rlvr_core.differences import difference_metric_names

        known = difference_metric_names()
        unknown = [name for name in v if name not in known]
        if unknown:
            raise ValueError(f"unknown difference metric {unknown[0]!r}; known: {', '.join(known)} (or [] for none)")
        if len(set(v)) != len(v):
            raise ValueError("each metric may be listed once")
        return v

    @field_validator("max_difference_clip")
    @classmethod
    def _clip(cls, v: float) -> float:
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"must be a positive number; got {v}")
        return v

    @model_validator(mode="after")
    def _engine_scores_completions(self) -> EvaluationConfig:
        from rlvr_core.engines.registry import ENGINES

        if (self.difference_metrics and self.engine in ENGINES
                and not getattr(ENGINES.get(self.engine), "teacher_forcing", False)):
            raise ValueError(f"difference_metrics: engine {self.engine!r} cannot score given completions, which "
                                 "difference releases need; set evaluation.difference_metrics = [] or use the "
                                 "'transformers' engine")
        return self


class PrivacyConfig(Section):
    """Differential privacy of the feedback split.

    Each release is one Poisson-subsampled Gaussian mechanism: every held-out row is kept
    with probability `sample_rate`, per-prompt scores in [0, 1] are summed per candidate,
    Gaussian noise with std = noise_multiplier is added to each sum, and the sum is divided
    by the public expected size sample_rate * N. The noise multiplier is calibrated so that
    `planned_releases` single-candidate releases spend exactly `epsilon_budget` at `delta`.
    """

    enabled: bool = Field(
        default=True,
        description="false releases exact accuracy (no guarantee). Use only for trusted trainers.",
    )
    epsilon_budget: float = Field(default=4.0, description="Total epsilon the node may ever spend.")
    delta: float = Field(default=1e-6, description="DP delta; must be below 1 / held-out size.")
    planned_releases: int = Field(
        default=500, description="Single-candidate releases the budget is calibrated for."
    )
    sample_rate: float = Field(
        default=0.1, description="Poisson sampling rate q in (0, 1]; 1 evaluates every row."
    )
    accountant: str = Field(
        default="rdp",
        description="Privacy accountant: a registered name (protocol.privacy.accountants), e.g. 'rdp' or 'prv'.",
    )

    @field_validator("accountant")
    @classmethod
    def _known_accountant(cls, v: str) -> str:
        from protocol.privacy.accountants import check_accountant_name

        return check_accountant_name(v)

    per_client_epsilon_cap: float = Field(
        default=0.0, description="Most epsilon one client may spend; 0 = no cap."
    )
    row_cap_tail: float = Field(
        default=1e-10,
        description="Every query evaluates a fixed, public number of rows M, the smallest with "
        "P(subsample size > M) <= row_cap_tail; a larger subsample is cut to a random M rows, which adds at "
        "most row_cap_tail to delta per release. Smaller = more padding rows per query.",
    )

    @field_validator("epsilon_budget")
    @classmethod
    def _epsilon(cls, v: float) -> float:
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"must be a positive finite number; got {v}")
        return v

    @field_validator("delta")
    @classmethod
    def _delta(cls, v: float) -> float:
        if not 0 < v < 1:
            raise ValueError(f"must be in (0, 1); got {v:g}")
        return v

    @field_validator("planned_releases")
    @classmethod
    def _releases(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1; got {v}")
        return v

    @field_validator("sample_rate")
    @classmethod
    def _rate(cls, v: float) -> float:
        if not 0 < v <= 1:
            raise ValueError(f"must be in (0, 1]; got {v:g}")
        return v

    @field_validator("per_client_epsilon_cap")
    @classmethod
    def _cap(cls, v: float) -> float:
        if not (v >= 0 and math.isfinite(v)):
            raise ValueError(f"must be 0 (no cap) or a positive number; got {v}")
        return v

    @field_validator("row_cap_tail")
    @classmethod
    def _tail(cls, v: float) -> float:
        if not 0 < v < 1:
            raise ValueError(f"must be in (0, 1), e.g. 1e-10; got {v:g}")
        return v

    @staticmethod
    def tail_for(delta: float, planned_releases: int) -> float:
        """The default row_cap_tail, or the largest one-significant-digit value below it that keeps
        planned_releases x row_cap_tail within a tenth of delta (what `init` and `launch` write)."""
        default = PrivacyConfig.model_fields["row_cap_tail"].default
        planned = max(1, int(planned_releases))
        if default * planned <= delta / 10:  # the validator's own comparison, rounding included
            return default
        exponent = math.floor(math.log10(delta / 10 / planned))
        digit = 9
        while float(f"{digit}e{exponent}") * planned > delta / 10:
            digit, exponent = (digit - 1, exponent) if digit > 1 else (9, exponent - 1)
        return float(f"{digit}e{exponent}")

    @model_validator(mode="after")
    def _tail_small_beside_delta(self) -> PrivacyConfig:
        # Over the planned releases the truncation events add planned_releases * row_cap_tail to delta;
        # keep that a small share of the declared delta so the stated guarantee stays honest.
        if self.enabled and self.row_cap_tail * self.planned_releases > self.delta / 10:
            raise ValueError(
                f"row_cap_tail: {self.row_cap_tail:g} x planned_releases {self.planned_releases} adds more than "
                f"a tenth of delta ({self.delta:g}); lower row_cap_tail to at most "
                f"{self.delta / 10 / self.planned_releases:.1g}"
            )
        return self


class TlsConfig(Section):
    ca_cert: ConfigPath = Field(description="PEM of the CA that signs trainer (client) certificates.")
    server_cert: ConfigPath = Field(description="PEM certificate the node presents.")
    server_key: ConfigPath = Field(description="PEM private key of server_cert.")
    require_client_auth: bool = Field(
        default=True, description="Demand a client certificate signed by ca_cert (mTLS)."
    )


class ServerConfig(Section):
    listen_address: str = Field(default="127.0.0.1:50051", description="HOST:PORT to listen on.")
    insecure: bool = Field(
        default=False, description="Plaintext, for loopback-only development. Refused on other addresses."
    )
    max_workers: int = Field(default=8, description="gRPC handler threads.")
    shutdown_grace_s: float = Field(
        default=30.0, description="On SIGTERM, how long in-flight calls may finish."
    )
    drain_delay_s: float = Field(
        default=1.0, description="On SIGTERM, how long health reports NOT_SERVING before the port closes."
    )
    health_address: str | None = Field(
        default=None,
        description="Optional plaintext HOST:PORT serving only grpc.health.v1 (for container health "
        "checks, which hold no client certificate); keep it on loopback.",
    )

    @field_validator("listen_address")
    @classmethod
    def _address(cls, v: str) -> str:
        _, port = split_address(v)
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in [0, 65535]; got {port}")
        return v

    @field_validator("health_address")
    @classmethod
    def _health_address(cls, v: str | None) -> str | None:
        if v is not None:
            _, port = split_address(v)
            if not 0 <= port <= 65535:
                raise ValueError(f"port must be in [0, 65535]; got {port}")
        return v

    @field_validator("max_workers")
    @classmethod
    def _workers(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1; got {v}")
        return v

    @field_validator("shutdown_grace_s", "drain_delay_s")
    @classmethod
    def _non_negative(cls, v: float) -> float:
        if not (v >= 0 and math.isfinite(v)):
            raise ValueError(f"must be a non-negative number of seconds; got {v}")
        return v

    @field_validator("insecure")
    @classmethod
    def _insecure_only_on_loopback(cls, v: bool, info: ValidationInfo) -> bool:
        address = info.data.get("listen_address")
        if v and address is not None and not is_loopback(split_address(address)[0]):
            raise ValueError(
                f"true is only allowed on a loopback listen_address (127.0.0.1, ::1, localhost); got "
                f"{address!r}. Plaintext would expose results and uploads: configure [tls] and set insecure = false."
            )
        return v


class StorageConfig(Section):
    dir: ConfigPath = Field(description="Folder for checkpoints, the privacy ledger and the audit log.")
    state_marker: ConfigPath | None = Field(
        default=None,
        description="A file OUTSIDE dir recording that dir has spent privacy budget, so a start that finds "
        "dir emptied refuses; default <config folder>/.target-owner-node-state.json.",
    )
    max_checkpoint_bytes: int = Field(
        default=8 << 30, description="Largest accepted checkpoint (all files together)."
    )
    quota_bytes: int = Field(
        default=64 << 30, description="Most bytes of checkpoint blobs the node will store."
    )

    _default_marker: Path | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _default_marker_next_to_config(cls, data: Any, handler, info: ValidationInfo) -> StorageConfig:
        config = handler(data)
        if config.state_marker is None:
            # Next to the config file, unless that folder lies inside dir (e.g. dir = "."): then beside dir.
            base = config_dir(info)
            marker = base / STATE_MARKER_NAME if base is not None else None
            if marker is None or _is_inside(marker, config.dir):
                marker = config.dir.parent / STATE_MARKER_NAME
            config._default_marker = marker
        return config

    @model_validator(mode="after")
    def _marker_outside_dir(self) -> StorageConfig:
        if self.state_marker is not None and _is_inside(self.state_marker, self.dir):
            raise ValueError(
                f"state_marker ({self.state_marker}) must lie outside storage.dir ({self.dir}): it records "
                f"that dir spent budget, so it must survive losing dir"
            )
        return self

    @property
    def state_marker_explicit(self) -> bool:
        """Whether the config names the marker (then a marker that cannot be written stops the node)."""
        return self.state_marker is not None

    @property
    def state_marker_path(self) -> Path:
        if self.state_marker is not None:
            return self.state_marker
        return self._default_marker or self.dir.parent / STATE_MARKER_NAME

    @field_validator("max_checkpoint_bytes", "quota_bytes")
    @classmethod
    def _positive_bytes(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be a positive number of bytes; got {v}")
        return v


class MetricsConfig(Section):
    """Prometheus /metrics (counts, latencies, epsilon spend; never data). Off unless `port` is set."""

    port: int | None = Field(default=None, description="Port of /metrics; unset = disabled, 0 = any free port.")
    host: str = Field(default="127.0.0.1", description="Address /metrics listens on (loopback by default).")
    allow_non_loopback: bool = Field(
        default=False,
        description="Serve /metrics on a non-loopback host. Off by default: metrics are for the owner's own "
        "monitoring, and whoever can scrape them sees request counts and the spend.",
    )

    @field_validator("port")
    @classmethod
    def _port(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v <= 65535:
            raise ValueError(f"must be in [0, 65535]; got {v}")
        return v

    @model_validator(mode="after")
    def _loopback_unless_allowed(self) -> MetricsConfig:
        if self.port is not None and not self.allow_non_loopback and not is_loopback(self.host):
            raise ValueError(
                f"host: {self.host!r} is not a loopback address; keep /metrics on 127.0.0.1 (publish it "
                "through your own proxy) or set metrics.allow_non_loopback = true knowingly"
            )
        return self


class AccessConfig(Section):
    allowed_clients: list[str] | None = Field(
        default=None,
        description="Client certificate common names allowed to call; unset = any cert the CA signed.",
    )


class OwnerConfig(Section):
    data: DataConfig = Field(description="The private held-out data and how each row is rendered and scored.")
    evaluation: EvaluationConfig = Field(
        default_factory=EvaluationConfig, description="The evaluation worker and the caps on what a trainer "
        "may ask."
    )
    privacy: PrivacyConfig = Field(
        default_factory=PrivacyConfig, description="Differential privacy of every release."
    )
    tls: TlsConfig | None = Field(
        default=None, description="mTLS certificates (required unless server.insecure)."
    )
    server: ServerConfig = Field(default_factory=ServerConfig, description="The gRPC server.")
    storage: StorageConfig = Field(description="Checkpoints, the privacy ledger and the audit log.")
    access: AccessConfig = Field(
        default_factory=AccessConfig, description="Which client certificates may call."
    )
    metrics: MetricsConfig = Field(
        default_factory=MetricsConfig, description="Prometheus /metrics (off by default)."
    )
    config_path: Path | None = Field(
        default=None, exclude=True, description="Where this config was read from."
    )

    @model_validator(mode="after")
    def _tls_unless_insecure(self) -> OwnerConfig:
        if self.tls is None and not self.server.insecure:
            raise ValueError(
                "[tls] section is required (ca_cert, server_cert, server_key) unless server.insecure = true"
            )
        return self


def _is_inside(path: Path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def split_address(address: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port). Raises ValueError naming the expected form."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"must look like HOST:PORT (e.g. 127.0.0.1:50051); got {address!r}")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_config(raw: dict[str, Any], base_dir: Path, source: str = "<dict>") -> OwnerConfig:
    """Validate a config mapping; relative paths resolve against `base_dir`."""
    return validate(OwnerConfig, raw, source=source, reference=REFERENCE, base_dir=base_dir)


def load_config(path: str | Path) -> OwnerConfig:
    """Read and validate a TOML config file. Raises ConfigError naming every bad setting."""
    path = Path(path).expanduser().resolve()
    raw = load_toml(path, missing_hint=" (create one with `target-owner-node init DIR`)")
    config = parse_config(raw, path.parent, str(path))
    return config.model_copy(update={"config_path": path})
