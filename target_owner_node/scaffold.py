"""`target-owner-node init DIR`: a ready-to-serve node folder.

Writes DIR/config.toml, DIR/pki/ (the owner's CA, the server certificate and one client
certificate for the trainer), DIR/heldout.jsonl and DIR/test.jsonl (the testbed's feedback
and test splits) and DIR/storage/. The single-CA pki/ serves a rehearsal on one machine (the
trainer there uses ca.pem and the client certificate + key); across two organizations each
makes its own CA, only ca.pem files cross and pki/ is deleted (docs/DEPLOY.md).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from rlvr_core.configuration import default_of
from rlvr_core.tasks.example import Example
from target_owner_node.config import EvaluationConfig, PrivacyConfig

CONFIG_TEMPLATE = """\
# Target-owner node configuration (written by `target-owner-node init`).
# Relative paths are resolved against this file's folder.

[data]
heldout_path = "heldout.jsonl"        # private feedback split (never leaves this machine)
test_path = "test.jsonl"              # the test split file (read only when test_split_enabled)
# SPLIT_TEST releases EXACT accuracy with no privacy guarantee: for simulation and benchmarks only.
test_split_enabled = {test_split_enabled}
test_domains = {test_domains}    # declared, public (GetInfo); every test row's domain must be listed
min_heldout_size = {min_heldout_size}
task_description = {task_description}
answer_format = {answer_format}
prompt_template = {prompt_template}
# chat_format = "chatml"              # render each prompt as a chat turn: a built-in format (published in GetInfo)
# chat_template_path = "chat.jinja"   # ...or your own Jinja chat template file (never one from an upload)
verifier = "per_example"              # or one verifier for every row: "exact_match", or an installed plug-in's name

[evaluation]
engine = "transformers"
device = "cpu"                        # e.g. "cuda:0"
max_new_tokens = 64                   # caps on what a trainer may request
max_prompt_tokens = {max_prompt_tokens}                # PUBLIC prompt width: every prompt is padded or cut to it
max_samples_per_prompt = 8
max_candidates_per_query = 8
batch_size = 16
timeout_s = 1800

[privacy]
enabled = {dp_enabled}
epsilon_budget = {epsilon}           # total epsilon this node will ever spend
delta = {delta}                          # must be below 1 / held-out size
planned_releases = {planned_releases}                # the noise is calibrated so this many releases fit the budget
sample_rate = {sample_rate}                     # Poisson subsampling rate q (1.0 = every row)
row_cap_tail = {row_cap_tail}                   # P(subsample > rows_per_query); x planned_releases stays <= delta / 10
accountant = "rdp"                    # or "prv"
per_client_epsilon_cap = 0.0          # 0 = no per-client cap

[tls]
ca_cert = {ca_cert}
server_cert = {server_cert}
server_key = {server_key}
require_client_auth = true

[server]
listen_address = "127.0.0.1:50051"
insecure = false
max_workers = 8
shutdown_grace_s = 30.0               # on SIGTERM, how long in-flight calls may finish
drain_delay_s = 1.0                   # on SIGTERM, how long health says NOT_SERVING before closing

[storage]
dir = "storage"
max_checkpoint_bytes = 8589934592     # 8 GiB
quota_bytes = 68719476736             # 64 GiB

[access]
allowed_clients = [{client_name}]
"""


@dataclass(frozen=True)
class InitResult:
    config_path: Path
    heldout_path: Path
    test_path: Path
    owner_files: dict[str, Path]
    trainer_files: dict[str, Path]


def plant_canaries(examples: list[Example], canaries: list[str]) -> list[Example]:
    """Append canary i to the prompt and the answer of row i (mod N), for leak tests."""
    planted = list(examples)
    for position, canary in enumerate(canaries):
        row = position % len(planted)
        example = planted[row]
        planted[row] = dataclasses.replace(
            example, prompt=f"{example.prompt} {canary}", answer=f"{example.answer} {canary}"
        )
    return planted


def init_node(
    directory: Path,
    testbed: str | None = None,
    server_names: list[str] | None = None,
    client_name: str = "trainer",
    epsilon: float = default_of(PrivacyConfig, "epsilon_budget"),
    dp_enabled: bool = True,
    canaries: list[str] | None = None,
    sample_rate: float = default_of(PrivacyConfig, "sample_rate"),
    planned_releases: int = default_of(PrivacyConfig, "planned_releases"),
    test_split_enabled: bool = False,
    max_prompt_tokens: int = default_of(EvaluationConfig, "max_prompt_tokens"),
) -> InitResult:
    """Create a node folder. Refuses to overwrite an existing config.toml.

    The test split is written but served only with `test_split_enabled` (exact, uncharged
    accuracy: no privacy guarantee). Its declared domains are the testbed's target domains.
    """
    from protocol.tls import write_owner_pki
    from rlvr_core.tasks.io import write_examples
    from rlvr_core.tasks.testbed import DEFAULT_TESTBED, build_testbed_data, load_testbed

    directory = Path(directory).resolve()
    config_path = directory / "config.toml"
    if config_path.exists():
        raise FileExistsError(f"{config_path} already exists; choose another folder or remove it first")
    directory.mkdir(parents=True, exist_ok=True)
    spec = load_testbed(testbed or DEFAULT_TESTBED)
    data = build_testbed_data(spec)
    feedback = list(data.feedback)
    if canaries:
        feedback = plant_canaries(feedback, canaries)
    heldout_path, test_path = directory / "heldout.jsonl", directory / "test.jsonl"
    write_examples(heldout_path, feedback)
    write_examples(test_path, data.test)
    (directory / "storage").mkdir(exist_ok=True)
    pki = write_owner_pki(
        directory / "pki", server_names or ["localhost", "127.0.0.1"], client_name=client_name
    )
    template = getattr(spec, "prompt_template", None)
    if not template:
        from rlvr_core.tasks.prompting import DEFAULT_PROMPT_TEMPLATE

        template = DEFAULT_PROMPT_TEMPLATE
    config_path.write_text(
        CONFIG_TEMPLATE.format(
            min_heldout_size=min(100, len(feedback)),
            task_description=_toml_string(getattr(spec, "description", "") or f"testbed {spec.name}"),
            answer_format=_toml_string(
                getattr(spec, "answer_format", "") or "the final answer after 'Answer:'"
            ),
            prompt_template=_toml_string(template),
            dp_enabled="true" if dp_enabled else "false",
            test_split_enabled="true" if test_split_enabled else "false",
            max_prompt_tokens=int(max_prompt_tokens),
            test_domains=_toml_list(declared_test_domains(spec)),
            epsilon=repr(float(epsilon)),
            delta=repr(float(default_of(PrivacyConfig, "delta"))),
            sample_rate=repr(float(sample_rate)),
            planned_releases=int(planned_releases),
            row_cap_tail=repr(PrivacyConfig.tail_for(default_of(PrivacyConfig, "delta"), planned_releases)),
            client_name=_toml_string(client_name),
            **{
                key: _toml_string(Path(pki[key]).relative_to(directory).as_posix())
                for key in ("ca_cert", "server_cert", "server_key")
            },
        ),
        encoding="utf-8",
    )
    trainer_keys = {"ca_cert", "client_cert", "client_key"}
    return InitResult(
        config_path=config_path,
        heldout_path=heldout_path,
        test_path=test_path,
        owner_files={k: Path(v) for k, v in pki.items() if k not in trainer_keys or k == "ca_cert"},
        trainer_files={k: Path(v) for k, v in pki.items() if k in trainer_keys},
    )


def declared_test_domains(spec) -> list[str]:
    """The testbed's public target domains: the names its test rows are reported under."""
    return sorted({entry.domain for entry in spec.target})


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(_toml_string(value) for value in values) + "]"


def _toml_string(value: str) -> str:
    """A TOML basic string (JSON string escapes are valid TOML escapes for these characters)."""
    return json.dumps(value, ensure_ascii=False)
