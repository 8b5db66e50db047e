"""The trainer's typed run configuration, loaded from TOML and validated once at the edge.

Built on the config edge both nodes share (rlvr_core/configuration.py): every section
forbids unknown keys, every field carries a description, and every error names the field
and how to fix it, e.g.

    grpo.lr: Input should be greater than 0; got -0.1
    policy.name: unknown data policy 'uniformm'; known: uniform, ...
    policy.lamda_waste: not an option of data policy 'l2rr'; did you mean 'lambda_waste'? ...

The pluggable parts are typed by their registry entries: `[policy]` by the options model of
the policy it names (its options sit directly in the table), `[rollout.options]` by the
engine's, `[model.tiny_spec]` by TinyPolicySpec. The resolved config (every default used
filled in) is written as JSON next to every run (resolved_config.json).

Every input path in the file (model.path, data.testbed when it is a file, data.prompts.path,
the [feedback] certificates) resolves against the config file's folder, as in the owner's
config. Outputs (run.out_dir, model.cache_dir) are relative to the working directory, like the
command line's --out, so a packaged or shared config writes where the command runs.
Defaults fit the tiny CPU setting (a few-million-parameter model, short answers).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SerializeAsAny, ValidationError, ValidationInfo, field_validator, model_validator

from rlvr_core.configuration import (
    ConfigError,
    ConfigPath,
    Section,
    field_error,
    load_toml,
    validate,
    validate_options,
)
from rlvr_core.models.tiny_spec import TinyPolicySpec
from rlvr_core.tasks.prompt_data import PromptSetSpec
from trainer_node.feedback.aggregation import AggregationOptions
from trainer_node.grpo.settings import GRPOSettings
from trainer_node.lora import LoraSettings
from trainer_node.policies.options import PolicyOptions

REFERENCE = "trainer_node/configs/train_default.toml"  # where unknown-key errors send the reader


class ModelConfig(Section):
    """Which policy model to train: a local directory, or the project's tiny model."""

    path: ConfigPath | None = Field(
        default=None,
        description="A local transformers causal-LM folder as save_pretrained or the hub write it (config.json, "
        "safetensors weights, possibly sharded, tokenizer files, chat_template.jinja; README, LICENSE and "
        "images are ignored), relative to the config file's folder. Never a hub id; never pickle weights.",
    )
    tiny: bool = Field(
        default=False, description="Build (or reuse from cache_dir) the tiny policy: tokenizer + SFT on the "
        "source data."
    )
    tiny_spec: TinyPolicySpec = Field(
        default=TinyPolicySpec(),
        description="The tiny policy's shape and warm-up (rlvr_core.models.tiny_spec.TinyPolicySpec; tiny = "
        "true only).",
    )
    cache_dir: Path = Field(
        default=Path(".cache/tiny_policies"),
        description="Where built tiny policies are cached, keyed by spec and data (an output: relative to the "
        "working directory).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(default="float32", description="Weights dtype.")
    lora: LoraSettings | None = Field(
        default=None, description="Train a LoRA adapter (PEFT, the `lora` extra) instead of every parameter; "
        "candidates and releases then send only the adapter (trainer_node/lora.py). Absent = full-parameter.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.path is None) == (not self.tiny):
            raise ValueError("set exactly one of `path = \"DIR\"` or `tiny = true`")
        if "tiny_spec" in self.model_fields_set and not self.tiny:
            raise ValueError("tiny_spec is only used with tiny = true; remove it or set tiny = true")
        return self


class DataConfig(Section):
    """The trainer's source data: a testbed, or its own prompts ([data.prompts]), and how prompts are rendered."""

    testbed: str = Field(
        default="default", description="A testbed name (rlvr_core.tasks.testbed) or a path to a testbed "
        "TOML file. Not used with [data.prompts]."
    )
    prompts: PromptSetSpec | None = Field(
        default=None,
        description="Your own prompt set instead of a testbed: JSONL, Parquet, a `datasets` folder or verl's RL "
        "parquet (rlvr_core/tasks/prompt_data.py), with configurable columns and a default verifier.",
    )
    prompt_template: str | None = Field(
        default=None,
        description="How a prompt fills the user turn, with {prompt} once (default: the testbed's, or "
        "\"{prompt}\\nAnswer:\" with [data.prompts]).",
    )
    rendering: Literal["auto", "owner", "tokenizer", "template"] = Field(
        default="auto",
        description="How prompts become model input. owner: the target owner's published rendering (GetInfo), so "
        "both parties score the same text; tokenizer: the model's own chat template; template: prompt_template "
        "alone. auto: owner with [feedback], else tokenizer when the tokenizer has a chat template, else template.",
    )
    eval_size: int = Field(
        default=64, ge=0, description="Source examples held out of the training pool for `train`'s local "
        "eval (0 = none)."
    )
    grader: Literal["testbed", "exact"] | dict[str, Any] = Field(
        default="testbed",
        description="What rewards rollouts. testbed: the testbed's declared source grader (its grader noise; "
        "each row's exact verifier when it declares none); exact: each row's exact verifier (the noise-free "
        "ceiling); or a noisy verifier, e.g. { name = \"noisy_flip\", flip_rate = 0.2 } (rlvr_core/verifiers/"
        "noisy.py).",
    )
    train_on_feedback_split: bool = Field(
        default=False,
        description="The \"target-mix\" diagnostic (simulate only): add the owner's feedback split to the "
        "training pool. It breaks the two-party privacy model on purpose, as an upper reference.",
    )

    @field_validator("testbed")
    @classmethod
    def _testbed_file_beside_config(cls, testbed: str, info: ValidationInfo) -> str:
        from rlvr_core.configuration import resolve_config_path
        from rlvr_core.tasks.testbed import testbed_names

        if testbed in testbed_names():
            return testbed
        return str(resolve_config_path(Path(testbed), info))  # a testbed file is an input: beside the config

    @field_validator("grader")
    @classmethod
    def _grader(cls, grader: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(grader, dict):
            from rlvr_core.verifiers.base import make_verifier

            make_verifier(grader)  # a ValidationError located at the bad option: data.grader.<option>
        return grader

    @field_validator("prompt_template")
    @classmethod
    def _template(cls, template: str | None) -> str | None:
        from rlvr_core.tasks.prompting import validate_template

        return None if template is None else validate_template(template)

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        if self.prompts is not None and "testbed" in self.model_fields_set:
            raise ValueError("testbed and prompts: set one source, a testbed or [data.prompts]")
        return self


class RolloutConfig(Section):
    """How rollouts are generated."""

    engine: str = Field(
        default="transformers", description="A registered generation engine (rlvr_core.engines.registry)."
    )
    max_new_tokens: int = Field(default=8, gt=0, description="Completion length cap (tokens).")
    temperature: float = Field(
        default=1.0, gt=0, description="Sampling temperature (> 0: GRPO needs diverse rollouts). Logprobs "
        "use the same one."
    )
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
    options: Any = Field(
        default=None, validate_default=True,
        description="The engine's options, typed by its registered options model (e.g. transformers: "
        "batch_size, num_threads).",
    )

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, name: str) -> str:
        from rlvr_core.engines.registry import engine_names

        if name not in engine_names():
            raise ValueError(f"unknown engine {name!r}; known: {', '.join(engine_names())}")
        return name

    @field_validator("options")
    @classmethod
    def _typed_options(cls, value: Any, info: ValidationInfo) -> Any:
        engine = info.data.get("engine")
        if engine is None:
            return value  # the engine's own error is reported already
        from rlvr_core.engines.registry import ENGINES

        raw = {} if value is None else value
        model = ENGINES.options_model(engine)
        if model is None:  # a plug-in engine without an options model: passed through as given
            if not isinstance(raw, Mapping):
                raise ValueError(f"must be a table of engine {engine!r} options")
            return dict(raw)
        return validate_options(model, raw, part=f"engine {engine!r}")

    def engine_kwargs(self) -> dict[str, Any]:
        """The options as build_engine keyword arguments."""
        return self.options.model_dump() if hasattr(self.options, "model_dump") else dict(self.options)


class EngineConfig(Section):
    """Which training engine runs the GRPO steps (trainer_node/integrations/support.py)."""

    name: str = Field(
        default="trainer_node",
        description="A registered training engine: 'trainer_node' (this project's own loop: every policy and "
        "estimator) or 'trl' (TRL's GRPOTrainer, the `trl` extra: policies l2rr or uniform, L2RR with "
        "estimator = \"release_difference\"; docs/SCALE.md).",
    )
    options: Any = Field(
        default=None, validate_default=True,
        description="The engine's options, typed by its registered options model (trl: loss_type, beta, ...).",
    )

    @field_validator("name")
    @classmethod
    def _known_engine(cls, name: str) -> str:
        from trainer_node.integrations.support import TRAINING_ENGINES

        if name not in TRAINING_ENGINES:
            raise ValueError(f"unknown training engine {name!r}; known: {', '.join(TRAINING_ENGINES.names())}")
        return name

    @field_validator("options")
    @classmethod
    def _typed_options(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.data.get("name")
        if name is None:
            return value  # the name's own error is reported already
        from trainer_node.integrations.support import TRAINING_ENGINES

        raw = {} if value is None else value
        model = TRAINING_ENGINES.options_model(name)
        if model is None:
            if raw:
                raise ValueError(f"training engine {name!r} takes no options; remove [engine.options]")
            return None
        return validate_options(model, raw, part=f"training engine {name!r}")


class RunConfig(Section):
    """Length, seed, outputs and device of the run."""

    steps: int = Field(default=300, gt=0, description="GRPO steps (total, counting resumed ones).")
    seed: int = Field(default=0, description="Run seed: initial policy, sampling, rollouts.")
    out_dir: Path = Field(
        default=Path("runs/train"), description="Run directory (an output: relative to the working directory)."
    )
    eval_every: int = Field(
        default=0, ge=0, description="Local eval on the held-out source slice every k steps (0 = only "
        "before and after)."
    )
    save_every: int = Field(default=0, ge=0, description="Checkpoint every k steps (0 = only at the end).")
    device: str = Field(default="cpu", description="'cpu' or 'cuda[:N]'.")

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        if device != "cpu" and not device.startswith("cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
        return device


class SelectionConfig(Section):
    """Checkpoint selection by target feedback (the L2RR paper's Table 12), any method.

    Every `every` steps (and at the end) the live model becomes a candidate; after training,
    ONE multi-candidate release on the owner's feedback split picks the best, charged like
    any release (one query is kept back from the sampler's budget for it)."""

    every: int = Field(
        default=0, ge=0, description="Candidate interval in steps (0 = off: the final model is reported)."
    )
    max_candidates: int = Field(
        default=8, ge=2,
        description="At most this many candidates (evenly thinned, the final model always kept); the owner "
        "caps candidates per query (evaluation.max_candidates_per_query, default 8).",
    )


class FeedbackSettingsSection(Section):
    """What every owner of a run shares: whether one must answer at start, deadlines, decoding, pacing."""

    required: bool = Field(
        default=True,
        description="Stop with an error when the owner is unreachable or refuses this trainer at start (true), or "
        "train on without feedback when it is unreachable (false). A wrong CA, server name or certificate always "
        "stops the run; a privacy budget that runs out mid-run never does (the summary says when feedback "
        "stopped and why). With several owners ([[feedback.owners]]): true = at least one owner must pass the "
        "start checks; an owner that fails them is left out and named in the log and summary.json.",
    )
    deadline_s: float = Field(
        default=30.0, gt=0, description="Deadline of GetInfo/GetBudget calls (seconds)."
    )
    evaluate_deadline_s: float = Field(
        default=600.0, gt=0, description="Deadline of one Evaluate call (seconds)."
    )
    max_attempts: int = Field(
        default=5, ge=1, le=5,
        description="Attempts for UNAVAILABLE only (grpc's retry policy, which allows at most 5); "
        "RESOURCE_EXHAUSTED, UNAUTHENTICATED and PERMISSION_DENIED are never retried.",
    )
    samples_per_prompt: int = Field(
        default=1, ge=1, description="Samples per held-out prompt the owner decodes (k)."
    )
    temperature: float = Field(
        default=0.0, ge=0, description="Decoding of the owner's evaluations (0 = greedy, lowest variance)."
    )
    min_interval: int = Field(
        default=1, ge=1,
        description="Never query more often than every this many steps (budget pacing may space queries "
        "more).",
    )
    final_release: bool = Field(
        default=True, description="Ask the owner for the final checkpoint's held-out accuracy (one release, "
        "charged)."
    )

    def client_settings_for(self, endpoint: OwnerEndpoint):
        from trainer_node.feedback.client import ClientSettings

        return ClientSettings(
            target=endpoint.target, ca_cert=endpoint.ca_cert, client_cert=endpoint.client_cert,
            client_key=endpoint.client_key, server_name=endpoint.server_name, deadline_s=self.deadline_s,
            evaluate_deadline_s=self.evaluate_deadline_s, max_attempts=self.max_attempts,
        )


class OwnerEndpoint(Section):
    """Where one target owner serves and the mTLS files to reach it (paths relative to the config file)."""

    target: str = Field(description="The owner's address, HOST:PORT.")
    ca_cert: ConfigPath = Field(
        description="The OWNER organization's CA certificate (verifies the owner's server certificate)."
    )
    client_cert: ConfigPath = Field(
        description="This trainer's client certificate, issued by a CA the owner trusts."
    )
    client_key: ConfigPath = Field(description="The private key of client_cert.")
    server_name: str | None = Field(
        default=None, description="TLS name to expect when `target` is an address not named in the server "
        "certificate."
    )

    @field_validator("target")
    @classmethod
    def _host_port(cls, target: str) -> str:
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"must be HOST:PORT, got {target!r}")
        return target


class FeedbackConfig(OwnerEndpoint, FeedbackSettingsSection):
    """A remote target owner to learn from (two-party deployment). Absent = no feedback.

    Certificate paths are relative to the config file's folder. At start `train` checks the
    files, the TLS handshake and the owner's answer (trainer_node/feedback/preflight.py)."""

    def owner_entries(self) -> list[tuple[str, OwnerEndpoint]]:
        """(where in the config, endpoint) of each owner: here the one [feedback] owner."""
        return [("feedback", self)]

    def client_settings(self):
        return self.client_settings_for(self)


OWNER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a summary key and a folder name


class OwnerEntry(OwnerEndpoint):
    """One of several owners ([[feedback.owners]]): the single-owner connection keys, a name, a weight."""

    name: str = Field(
        description="The owner's name in logs and summary.json, and its folder under checkpoints_sent/ "
        "(letters, digits, _ . -; unique)."
    )
    weight: float | None = Field(
        default=None, ge=0,
        description="This owner's weight in a declared target mixture (set on every owner or none; with weights "
        "the aggregation is `mixture` unless [owners] names one). Absent: [owners] decides (default: by each "
        "owner's public held-out size).",
    )

    @field_validator("name")
    @classmethod
    def _folder_name(cls, name: str) -> str:
        if not OWNER_NAME.match(name):
            raise ValueError(f"must be 1-64 letters, digits, '_', '.' or '-', not starting with a symbol; "
                             f"got {name!r}")
        return name


class OwnersFeedbackConfig(FeedbackSettingsSection):
    """Several remote target owners ([[feedback.owners]] entries); the settings in [feedback] apply to each."""

    owners: list[OwnerEntry] = Field(
        min_length=1,
        description="One table per owner: name, target, ca_cert, client_cert, client_key, optional server_name "
        "and weight. Each owner has its own budget and pacer; [owners] says how their releases combine.",
    )

    @field_validator("owners")
    @classmethod
    def _unique_and_weighted_alike(cls, owners: list[OwnerEntry]) -> list[OwnerEntry]:
        seen: dict[str, int] = {}
        for index, owner in enumerate(owners):
            if owner.name in seen:
                raise field_error("OwnerEntry", (index, "name"), "value_error",
                                  f"{owner.name!r} is already the name of feedback.owners[{seen[owner.name]}]; "
                                  "give each owner its own name", owner.name)
            seen[owner.name] = index
        weighted = [owner.weight is not None for owner in owners]
        if any(weighted) and not all(weighted):
            index = weighted.index(False)
            raise field_error("OwnerEntry", (index, "weight"), "value_error",
                              "set a weight on every owner or on none (a declared mixture names every owner)", None)
        if all(weighted) and not sum(owner.weight for owner in owners):
            raise field_error("OwnerEntry", (0, "weight"), "value_error",
                              "the weights are all zero; give at least one owner a weight > 0", owners[0].weight)
        return owners

    def owner_entries(self) -> list[tuple[str, OwnerEndpoint]]:
        return [(f"feedback.owners[{index}]", owner) for index, owner in enumerate(self.owners)]

    def aggregation(self, declared: AggregationOptions | None) -> AggregationOptions:
        """[owners] with the owners' weights as its mixture (the mixture aggregation when [owners] names none)."""
        weights = {owner.name: owner.weight for owner in self.owners if owner.weight is not None}
        if not weights:
            return declared or AggregationOptions()
        base = declared.model_dump(exclude_unset=True) if declared is not None else {}
        base.setdefault("name", "mixture")
        return AggregationOptions(**{**base, "mixture": weights})


class SimulatedOwnerConfig(Section):
    """`trainer-node simulate` and the bench only: settings of the simulated target owner that a
    study varies. A real owner sets its own config (target_owner_node/config.py); a trainer
    talking to one ignores this section."""

    feedback_verifier: str | dict[str, Any] | None = Field(
        default=None,
        description="The simulated owner's data.feedback_verifier: the verifier scoring the held-out (feedback) "
        "split that L2RR learns from, a registered name or a table with its options, e.g. { name = "
        "\"noisy_flip\", flip_rate = 0.2 }; None: the exact verifier. The test split stays exact.",
    )

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="The simulated owner's evaluation.dtype: what it scores the trainer's checkpoints in. "
        "'auto' (float32 on a CPU) is what the published results used; 'bfloat16' is about 1.6x faster "
        "on a CPU with AMX and changes the owner's numbers slightly (its test-split measurements too).",
    )

    nice: int = Field(
        default=19, ge=0, le=19,
        description="The simulated owner's CPU priority, as for nice(1), applied to its server and scoring worker. "
        "It stands in for an owner on its own machine, so by default (19, the lowest) it computes on what the "
        "trainer leaves idle instead of slowing the training loop it shares the cores with; on 2 cores its "
        "releases still arrive well within max_staleness (docs/RESULTS.md 6.15). 10: the default until then; "
        "0: the trainer's priority (what runs before this option had). Used when scheduler = 'normal'.",
    )

    scheduler: Literal["normal", "idle"] = Field(
        default="normal",
        description="The simulated owner's CPU scheduling policy, for its server and scoring worker. 'normal': "
        "the usual policy, at priority `nice`. 'idle' (Linux SCHED_IDLE; elsewhere nice 19, overriding `nice`): "
        "it runs only on CPU time the trainer leaves idle. On 2 cores that starves it past the staleness bound, "
        "so the trainer waits for it (docs/RESULTS.md 6.11): the default stays 'normal'.",
    )

    noise: Literal["seeded", "secure"] = Field(
        default="seeded",
        description="Where the simulated owner draws each DP release's subsample and noise from. 'seeded': from "
        "the run's seed and the request's content (`target-owner-node serve --insecure-noise-seed`), so one seed "
        "gives the same run on any load; such noise gives NO privacy, which a simulation does not need. "
        "'secure': OS randomness, as a real owner draws it (every run then differs in its noise).",
    )

    test_samples_per_prompt: int = Field(
        default=1, ge=1, le=8,
        description="Samples per TEST-split prompt the simulated owner decodes for the before/after accuracy "
        "the summary reports (at most 8, the owner's default max_samples_per_prompt). 1 with test_temperature "
        "0: greedy accuracy (the published results). k > 1 with test_temperature > 0: the mean accuracy of k "
        "sampled answers per prompt (avg@k, as DAPO reports AIME), what GRPO's sampled reward optimises, "
        "measured with less variance.",
    )

    test_temperature: float = Field(
        default=0.0, ge=0,
        description="Decoding temperature of those TEST-split evaluations (0 = greedy).",
    )

    @model_validator(mode="after")
    def _test_decoding(self) -> SimulatedOwnerConfig:
        if self.test_samples_per_prompt > 1 and self.test_temperature == 0:
            raise ValueError(
                f"test_samples_per_prompt = {self.test_samples_per_prompt} with test_temperature = 0 decodes "
                "the same greedy answer k times; set test_temperature > 0 (e.g. 1.0) or test_samples_per_prompt = 1"
            )
        return self

    def process_options(self, run_seed: int) -> dict[str, Any]:
        """lab.owner_process.OwnerProcess's `nice`, `idle` and `noise_seed`, as this section sets them."""
        return {"nice": self.nice, "idle": self.scheduler == "idle",
                "noise_seed": run_seed if self.noise == "seeded" else None}

    @field_validator("feedback_verifier")
    @classmethod
    def _verifier(cls, spec: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if spec is not None:
            from rlvr_core.verifiers.base import make_verifier

            make_verifier(spec)  # a ValidationError located at the bad option: feedback_verifier.<option>
        return spec


def _default_policy() -> PolicyOptions:
    from trainer_node.policies.base import parse_policy_options

    return parse_policy_options({})


class TrainConfig(Section):
    """A whole run: one section per concern. (Section defaults are factories: building one validates
    it, and the engine's options validation imports the engine registry, so only on use.)"""

    model: ModelConfig = Field(description="The policy model to train.")
    data: DataConfig = Field(default_factory=DataConfig, description="Source data.")
    policy: SerializeAsAny[PolicyOptions] = Field(
        default_factory=_default_policy,
        description="The data policy: `name` picks a registered policy, whose options model types the rest "
        "of the table (shared: batch_size, rollouts_per_prompt).",
    )
    grpo: GRPOSettings = Field(
        default_factory=GRPOSettings, description="Advantage, loss and optimizer of the update."
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Rollout generation.")
    engine: EngineConfig = Field(
        default_factory=EngineConfig, description="The training engine: this project's own loop, or TRL's "
        "GRPOTrainer (docs/SCALE.md)."
    )
    run: RunConfig = Field(default_factory=RunConfig, description="Length, seed, outputs, device.")
    feedback: FeedbackConfig | OwnersFeedbackConfig | None = Field(
        default=None, description="A remote target owner (absent = none), or several: [[feedback.owners]] "
        "entries, each with the single owner's connection keys plus name and weight.",
    )
    selection: SelectionConfig = Field(
        default_factory=SelectionConfig, description="Checkpoint selection by feedback."
    )
    owners: AggregationOptions | None = Field(
        default=None, description="Several target owners (`simulate --owners N`, over Flower): how their "
        "releases are combined (aggregation heldout_size | mixture | per_owner) and when an owner is dropped; "
        "absent = heldout_size.",
    )
    simulated_owner: SimulatedOwnerConfig = Field(
        default_factory=SimulatedOwnerConfig, description="`simulate` and the bench only: the simulated "
        "owner's settings (its feedback split's verifier).",
    )

    @field_validator("policy", mode="wrap")
    @classmethod
    def _typed_policy(cls, value: Any, handler: Any) -> PolicyOptions:
        # Keyed on `name`: the registry (plug-ins included) says which options model applies.
        from trainer_node.policies.base import parse_policy_options

        return parse_policy_options(value)

    @field_validator("feedback", mode="wrap")
    @classmethod
    def _one_or_several_owners(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        # Keyed on `owners`: [[feedback.owners]] entries are the several-owner form, else one owner.
        if isinstance(value, Mapping) and "owners" in value:
            return OwnersFeedbackConfig.model_validate(value, context=info.context)
        if isinstance(value, Mapping):
            return FeedbackConfig.model_validate(value, context=info.context)
        return handler(value)

    @model_validator(mode="after")
    def _cross_checks(self) -> TrainConfig:
        if isinstance(self.feedback, OwnersFeedbackConfig):
            check_aggregation(self.feedback, self.owners)
        from trainer_node.integrations.support import check_engine_support, engine_support

        support = engine_support(self.engine.name)
        check_engine_support(self.policy, support)  # names the field and the fix
        if self.model.lora is not None and not support.lora:
            raise ValueError(f"model.lora: engine {self.engine.name!r} does not train LoRA adapters here; use "
                             "engine.name = 'trainer_node', or remove [model.lora]")
        if self.grpo.overlong_buffer >= self.rollout.max_new_tokens:
            raise ValueError(
                f"grpo.overlong_buffer ({self.grpo.overlong_buffer}) must be smaller than "
                f"rollout.max_new_tokens ({self.rollout.max_new_tokens}); lower it or set 0 to disable"
            )
        return self

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def save_resolved(self, run_dir: Path) -> Path:
        """Write the fully resolved config (every default used filled in) as run_dir/resolved_config.json."""
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "resolved_config.json"
        path.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        return path


def check_aggregation(feedback: OwnersFeedbackConfig, declared: AggregationOptions | None) -> None:
    """[owners] against the configured owners, at load: a mixture names every owner, per_owner one of them,
    and declared weights are the weights the aggregation gives (not silently ignored by another one)."""
    from trainer_node.feedback.aggregation import AGGREGATIONS

    if declared is not None and declared.mixture and any(o.weight is not None for o in feedback.owners):
        raise ValueError("owners.mixture and feedback.owners[].weight: declare the mixture once (the owners' "
                         "weights, or owners.mixture)")
    options = feedback.aggregation(declared)
    # Distinct probe sizes: an aggregation that weights by held-out size cannot match declared weights by chance.
    sizes = {owner.name: 100 + 7 * index for index, owner in enumerate(feedback.owners)}
    weights = AGGREGATIONS.get(options.name)(sizes, options)
    declared_weights = {o.name: o.weight for o in feedback.owners if o.weight is not None}
    if declared_weights:
        total = sum(declared_weights.values())
        if any(abs(weights[name] - w / total) > 1e-9 for name, w in declared_weights.items()):
            raise ValueError(f"feedback.owners[0].weight: aggregation {options.name!r} ([owners] name) does not "
                             "weight the owners by their declared weights; remove the weights, or the name to "
                             "use them as the target mixture")


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *sections, key = dotted.split(".")
    node = raw
    for section in sections:
        node = node.setdefault(section, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot override {dotted!r}: {section!r} is not a section")
    node[key] = value


def with_overrides(raw: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """A deep copy of `raw` with dotted overrides such as {'run.steps': 5} set (None values skipped)."""
    raw = json.loads(json.dumps(raw, default=str))  # TOML values are JSON-able
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(raw, dotted, value)
    return raw


def parse_config(
    raw: dict[str, Any],
    overrides: dict[str, Any] | None = None,
    source: str = "",
    base_dir: Path | None = None,
) -> TrainConfig:
    """Validate a raw dict (as read from TOML) plus dotted overrides such as {'run.steps': 5}.

    Relative input paths resolve against `base_dir` (the config file's folder; None: as given)."""
    raw = with_overrides(raw, overrides)
    return validate(TrainConfig, raw, source=source or "(dict)", reference=REFERENCE, base_dir=base_dir)


def load_feedback_section(path: Path | str) -> FeedbackConfig | OwnersFeedbackConfig:
    """The [feedback] section of a TOML file (a run config, or a file holding only that section; one
    owner, or several [[feedback.owners]]), paths resolved against the file's folder; ConfigError when it
    has none or it is invalid."""
    path = Path(path).expanduser()
    raw = load_toml(path)
    section = raw.get("feedback")
    if not isinstance(section, Mapping):
        raise ConfigError(f"{path}: no [feedback] section (target, ca_cert, client_cert, client_key, or "
                          "[[feedback.owners]] entries); see docs/DEPLOY.md step 7")
    model = OwnersFeedbackConfig if "owners" in section else FeedbackConfig
    try:
        return model.model_validate(section, context={"base_dir": path.resolve().parent})
    except ValidationError as error:
        from rlvr_core.configuration import format_errors

        wrapped = format_errors(error, str(path), reference=REFERENCE)
        raise ConfigError(wrapped.replace("\n  ", "\n  feedback.")) from None


def load_config(path: Path | str, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read and validate a TOML run config. Raises ConfigError naming every bad field."""
    path = Path(path).expanduser()
    return parse_config(load_toml(path), overrides, source=str(path), base_dir=path.resolve().parent)
