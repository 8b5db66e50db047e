from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VerifierKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERIFIER_KIND_UNSPECIFIED: _ClassVar[VerifierKind]
    VERIFIER_KIND_EXACT_MATCH: _ClassVar[VerifierKind]
    VERIFIER_KIND_MATH_VERIFY: _ClassVar[VerifierKind]
    VERIFIER_KIND_REASONING_GYM: _ClassVar[VerifierKind]
    VERIFIER_KIND_PER_EXAMPLE: _ClassVar[VerifierKind]
    VERIFIER_KIND_NAMED: _ClassVar[VerifierKind]

class Split(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPLIT_UNSPECIFIED: _ClassVar[Split]
    SPLIT_FEEDBACK: _ClassVar[Split]
    SPLIT_TEST: _ClassVar[Split]

class ReleaseKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RELEASE_KIND_UNSPECIFIED: _ClassVar[ReleaseKind]
    RELEASE_KIND_ACCURACY: _ClassVar[ReleaseKind]
    RELEASE_KIND_ACCURACY_DIFFERENCE: _ClassVar[ReleaseKind]
VERIFIER_KIND_UNSPECIFIED: VerifierKind
VERIFIER_KIND_EXACT_MATCH: VerifierKind
VERIFIER_KIND_MATH_VERIFY: VerifierKind
VERIFIER_KIND_REASONING_GYM: VerifierKind
VERIFIER_KIND_PER_EXAMPLE: VerifierKind
VERIFIER_KIND_NAMED: VerifierKind
SPLIT_UNSPECIFIED: Split
SPLIT_FEEDBACK: Split
SPLIT_TEST: Split
RELEASE_KIND_UNSPECIFIED: ReleaseKind
RELEASE_KIND_ACCURACY: ReleaseKind
RELEASE_KIND_ACCURACY_DIFFERENCE: ReleaseKind

class PrivacyParameters(_message.Message):
    __slots__ = ("enabled", "epsilon_budget", "delta", "planned_releases", "sample_rate", "noise_multiplier", "accountant", "expected_sample_size", "noise_std", "per_client_epsilon_cap", "rows_per_query", "row_cap_tail")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    EPSILON_BUDGET_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    PLANNED_RELEASES_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    NOISE_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTANT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SAMPLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    NOISE_STD_FIELD_NUMBER: _ClassVar[int]
    PER_CLIENT_EPSILON_CAP_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_QUERY_FIELD_NUMBER: _ClassVar[int]
    ROW_CAP_TAIL_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    epsilon_budget: float
    delta: float
    planned_releases: int
    sample_rate: float
    noise_multiplier: float
    accountant: str
    expected_sample_size: float
    noise_std: float
    per_client_epsilon_cap: float
    rows_per_query: int
    row_cap_tail: float
    def __init__(self, enabled: _Optional[bool] = ..., epsilon_budget: _Optional[float] = ..., delta: _Optional[float] = ..., planned_releases: _Optional[int] = ..., sample_rate: _Optional[float] = ..., noise_multiplier: _Optional[float] = ..., accountant: _Optional[str] = ..., expected_sample_size: _Optional[float] = ..., noise_std: _Optional[float] = ..., per_client_epsilon_cap: _Optional[float] = ..., rows_per_query: _Optional[int] = ..., row_cap_tail: _Optional[float] = ...) -> None: ...

class DecodingLimits(_message.Message):
    __slots__ = ("max_new_tokens", "max_samples_per_prompt", "max_candidates_per_query", "max_prompt_tokens")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_CANDIDATES_PER_QUERY_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    max_samples_per_prompt: int
    max_candidates_per_query: int
    max_prompt_tokens: int
    def __init__(self, max_new_tokens: _Optional[int] = ..., max_samples_per_prompt: _Optional[int] = ..., max_candidates_per_query: _Optional[int] = ..., max_prompt_tokens: _Optional[int] = ...) -> None: ...

class UploadLimits(_message.Message):
    __slots__ = ("max_checkpoint_bytes", "max_chunk_bytes", "allowed_architectures", "allowed_file_names")
    MAX_CHECKPOINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_ARCHITECTURES_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FILE_NAMES_FIELD_NUMBER: _ClassVar[int]
    max_checkpoint_bytes: int
    max_chunk_bytes: int
    allowed_architectures: _containers.RepeatedScalarFieldContainer[str]
    allowed_file_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, max_checkpoint_bytes: _Optional[int] = ..., max_chunk_bytes: _Optional[int] = ..., allowed_architectures: _Optional[_Iterable[str]] = ..., allowed_file_names: _Optional[_Iterable[str]] = ...) -> None: ...

class DeltaSupport(_message.Message):
    __slots__ = ("tensor_shards", "lora_adapters", "max_lora_rank", "max_adapter_bytes")
    TENSOR_SHARDS_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    MAX_ADAPTER_BYTES_FIELD_NUMBER: _ClassVar[int]
    tensor_shards: bool
    lora_adapters: bool
    max_lora_rank: int
    max_adapter_bytes: int
    def __init__(self, tensor_shards: _Optional[bool] = ..., lora_adapters: _Optional[bool] = ..., max_lora_rank: _Optional[int] = ..., max_adapter_bytes: _Optional[int] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ("protocol_version", "task_description", "answer_format", "verifier_kind", "heldout_size", "privacy", "decoding_limits", "upload_limits", "prompt_template", "test_split_enabled", "test_size", "test_domains", "verifier_name", "chat_template", "chat_format", "delta_support", "release_kinds", "difference_support")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TASK_DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FORMAT_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_KIND_FIELD_NUMBER: _ClassVar[int]
    HELDOUT_SIZE_FIELD_NUMBER: _ClassVar[int]
    PRIVACY_FIELD_NUMBER: _ClassVar[int]
    DECODING_LIMITS_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_LIMITS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    TEST_SPLIT_ENABLED_FIELD_NUMBER: _ClassVar[int]
    TEST_SIZE_FIELD_NUMBER: _ClassVar[int]
    TEST_DOMAINS_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_NAME_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    CHAT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    DELTA_SUPPORT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_KINDS_FIELD_NUMBER: _ClassVar[int]
    DIFFERENCE_SUPPORT_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    task_description: str
    answer_format: str
    verifier_kind: VerifierKind
    heldout_size: int
    privacy: PrivacyParameters
    decoding_limits: DecodingLimits
    upload_limits: UploadLimits
    prompt_template: str
    test_split_enabled: bool
    test_size: int
    test_domains: _containers.RepeatedScalarFieldContainer[str]
    verifier_name: str
    chat_template: str
    chat_format: str
    delta_support: DeltaSupport
    release_kinds: _containers.RepeatedScalarFieldContainer[ReleaseKind]
    difference_support: DifferenceSupport
    def __init__(self, protocol_version: _Optional[str] = ..., task_description: _Optional[str] = ..., answer_format: _Optional[str] = ..., verifier_kind: _Optional[_Union[VerifierKind, str]] = ..., heldout_size: _Optional[int] = ..., privacy: _Optional[_Union[PrivacyParameters, _Mapping]] = ..., decoding_limits: _Optional[_Union[DecodingLimits, _Mapping]] = ..., upload_limits: _Optional[_Union[UploadLimits, _Mapping]] = ..., prompt_template: _Optional[str] = ..., test_split_enabled: _Optional[bool] = ..., test_size: _Optional[int] = ..., test_domains: _Optional[_Iterable[str]] = ..., verifier_name: _Optional[str] = ..., chat_template: _Optional[str] = ..., chat_format: _Optional[str] = ..., delta_support: _Optional[_Union[DeltaSupport, _Mapping]] = ..., release_kinds: _Optional[_Iterable[_Union[ReleaseKind, str]]] = ..., difference_support: _Optional[_Union[DifferenceSupport, _Mapping]] = ...) -> None: ...

class DifferenceSupport(_message.Message):
    __slots__ = ("metrics", "max_clip", "answer_template")
    METRICS_FIELD_NUMBER: _ClassVar[int]
    MAX_CLIP_FIELD_NUMBER: _ClassVar[int]
    ANSWER_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.RepeatedScalarFieldContainer[str]
    max_clip: float
    answer_template: str
    def __init__(self, metrics: _Optional[_Iterable[str]] = ..., max_clip: _Optional[float] = ..., answer_template: _Optional[str] = ...) -> None: ...

class DifferenceRequest(_message.Message):
    __slots__ = ("metric", "clip")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    CLIP_FIELD_NUMBER: _ClassVar[int]
    metric: str
    clip: float
    def __init__(self, metric: _Optional[str] = ..., clip: _Optional[float] = ...) -> None: ...

class FileEntry(_message.Message):
    __slots__ = ("name", "size", "sha256")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    sha256: str
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class CheckpointManifest(_message.Message):
    __slots__ = ("files",)
    FILES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[FileEntry]
    def __init__(self, files: _Optional[_Iterable[_Union[FileEntry, _Mapping]]] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("name", "offset", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    offset: int
    data: bytes
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadCheckpointRequest(_message.Message):
    __slots__ = ("manifest", "chunk")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    manifest: CheckpointManifest
    chunk: FileChunk
    def __init__(self, manifest: _Optional[_Union[CheckpointManifest, _Mapping]] = ..., chunk: _Optional[_Union[FileChunk, _Mapping]] = ...) -> None: ...

class UploadCheckpointResponse(_message.Message):
    __slots__ = ("checkpoint_id", "bytes_received", "reused_files")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    REUSED_FILES_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    bytes_received: int
    reused_files: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, checkpoint_id: _Optional[str] = ..., bytes_received: _Optional[int] = ..., reused_files: _Optional[_Iterable[str]] = ...) -> None: ...

class DecodingSettings(_message.Message):
    __slots__ = ("max_new_tokens", "samples_per_prompt", "temperature", "seed")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    samples_per_prompt: int
    temperature: float
    seed: int
    def __init__(self, max_new_tokens: _Optional[int] = ..., samples_per_prompt: _Optional[int] = ..., temperature: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class EvaluateRequest(_message.Message):
    __slots__ = ("checkpoint_ids", "decoding", "split", "request_id", "kind", "difference")
    CHECKPOINT_IDS_FIELD_NUMBER: _ClassVar[int]
    DECODING_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DIFFERENCE_FIELD_NUMBER: _ClassVar[int]
    checkpoint_ids: _containers.RepeatedScalarFieldContainer[str]
    decoding: DecodingSettings
    split: Split
    request_id: str
    kind: ReleaseKind
    difference: DifferenceRequest
    def __init__(self, checkpoint_ids: _Optional[_Iterable[str]] = ..., decoding: _Optional[_Union[DecodingSettings, _Mapping]] = ..., split: _Optional[_Union[Split, str]] = ..., request_id: _Optional[str] = ..., kind: _Optional[_Union[ReleaseKind, str]] = ..., difference: _Optional[_Union[DifferenceRequest, _Mapping]] = ...) -> None: ...

class CandidateResult(_message.Message):
    __slots__ = ("checkpoint_id", "accuracy", "domain_accuracy", "accuracy_difference")
    class DomainAccuracyEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_DIFFERENCE_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    accuracy: float
    domain_accuracy: _containers.ScalarMap[str, float]
    accuracy_difference: float
    def __init__(self, checkpoint_id: _Optional[str] = ..., accuracy: _Optional[float] = ..., domain_accuracy: _Optional[_Mapping[str, float]] = ..., accuracy_difference: _Optional[float] = ...) -> None: ...

class PrivacySpend(_message.Message):
    __slots__ = ("noise_std", "epsilon_this_release", "epsilon_spent_total", "epsilon_remaining", "delta")
    NOISE_STD_FIELD_NUMBER: _ClassVar[int]
    EPSILON_THIS_RELEASE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EPSILON_REMAINING_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    noise_std: float
    epsilon_this_release: float
    epsilon_spent_total: float
    epsilon_remaining: float
    delta: float
    def __init__(self, noise_std: _Optional[float] = ..., epsilon_this_release: _Optional[float] = ..., epsilon_spent_total: _Optional[float] = ..., epsilon_remaining: _Optional[float] = ..., delta: _Optional[float] = ...) -> None: ...

class EvaluateResponse(_message.Message):
    __slots__ = ("results", "privacy", "release_id", "kind")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    PRIVACY_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CandidateResult]
    privacy: PrivacySpend
    release_id: str
    kind: ReleaseKind
    def __init__(self, results: _Optional[_Iterable[_Union[CandidateResult, _Mapping]]] = ..., privacy: _Optional[_Union[PrivacySpend, _Mapping]] = ..., release_id: _Optional[str] = ..., kind: _Optional[_Union[ReleaseKind, str]] = ...) -> None: ...

class GetBudgetRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetBudgetResponse(_message.Message):
    __slots__ = ("dp_enabled", "epsilon_budget", "epsilon_spent", "epsilon_remaining", "delta", "releases_made", "releases_remaining_estimate", "client_epsilon_spent", "client_epsilon_cap")
    DP_ENABLED_FIELD_NUMBER: _ClassVar[int]
    EPSILON_BUDGET_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_REMAINING_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    RELEASES_MADE_FIELD_NUMBER: _ClassVar[int]
    RELEASES_REMAINING_ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_EPSILON_CAP_FIELD_NUMBER: _ClassVar[int]
    dp_enabled: bool
    epsilon_budget: float
    epsilon_spent: float
    epsilon_remaining: float
    delta: float
    releases_made: int
    releases_remaining_estimate: int
    client_epsilon_spent: float
    client_epsilon_cap: float
    def __init__(self, dp_enabled: _Optional[bool] = ..., epsilon_budget: _Optional[float] = ..., epsilon_spent: _Optional[float] = ..., epsilon_remaining: _Optional[float] = ..., delta: _Optional[float] = ..., releases_made: _Optional[int] = ..., releases_remaining_estimate: _Optional[int] = ..., client_epsilon_spent: _Optional[float] = ..., client_epsilon_cap: _Optional[float] = ...) -> None: ...
