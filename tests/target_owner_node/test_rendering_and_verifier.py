"""The owner's declared rendering and verifier: chosen in its config (never by an upload), published in
GetInfo, used by the worker; an organization's own verifier plug-in scores held-out rows and nothing
it raises leaves the node."""

from __future__ import annotations

import pytest

from protocol.conformance.checks.info import PUBLIC_INFO_FIELDS, info_problems
from protocol.conformance.wire import set_field_paths
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from rlvr_core.tasks.rendering import CHAT_FORMATS, Rendering
from target_owner_node.config import ConfigError, parse_config
from target_owner_node.node import worker_spec
from target_owner_node.server import declared_verifier, info_response
from tests.plugin_install import install_verifier_plugin, verifiers_from

from .conftest import FakeScorer, RecordingClient, assert_no_canary, config_dict, make_config, running_server


def _data(tmp_path, data_dir, pki, **data):
    return parse_config(config_dict(tmp_path, data_dir, pki, data=data), tmp_path)


def test_a_built_in_chat_format_is_the_owners_rendering_and_is_published(tmp_path, data_dir, pki):
    config = _data(tmp_path, data_dir, pki, chat_format="chatml", prompt_template="{prompt}\nAnswer:")
    assert config.data.rendering() == Rendering.chat("chatml", "{prompt}\nAnswer:")
    assert worker_spec(config).rendering == config.data.rendering()
    with running_server(config, scorer=FakeScorer()) as running:
        info = info_response(running.node)
    assert (info.chat_format, info.chat_template) == ("chatml", CHAT_FORMATS["chatml"])
    assert Rendering.from_info(info).render("2+2") == "<|im_start|>user\n2+2\nAnswer:<|im_end|>\n<|im_start|>assistant\n"
    assert not info_problems(info) and set_field_paths(info) <= PUBLIC_INFO_FIELDS


def test_a_template_file_of_the_owner_relative_to_its_config(tmp_path, data_dir, pki):
    (tmp_path / "chat.jinja").write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<bot>")
    config = _data(tmp_path, data_dir, pki, chat_template_path="chat.jinja", prompt_template="{prompt}")
    assert config.data.rendering().render("hi") == "<user>hi<bot>"
    assert config.data.rendering().chat_format == ""


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"chat_format": "chatml", "chat_template_path": "chat.jinja"}, "set at most one"),
        ({"chat_format": "alpaca"}, "data.chat_format: must be one of chatml"),
        ({"chat_template_path": "missing.jinja"}, r"chat_template_path: .*missing.jinja: chat template file not found"),
        ({"chat_template_path": "broken.jinja"}, r"broken.jinja: chat template line 1"),
    ],
)
def test_bad_rendering_settings_are_refused_at_load(tmp_path, data_dir, pki, data, message):
    (tmp_path / "chat.jinja").write_text("{{ messages[0]['content'] }}")
    (tmp_path / "broken.jinja").write_text("{% if %}")
    with pytest.raises(ConfigError, match=message):
        _data(tmp_path, data_dir, pki, **data)


def test_getinfo_declares_the_verifier_by_kind_and_name():
    assert declared_verifier("per_example") == (pb.VERIFIER_KIND_PER_EXAMPLE, "")
    assert declared_verifier("exact_match") == (pb.VERIFIER_KIND_EXACT_MATCH, "exact_match")
    assert declared_verifier("math_verify") == (pb.VERIFIER_KIND_MATH_VERIFY, "math_verify")


def test_the_conformance_card_checks_cover_the_new_fields():
    base = {"protocol_version": "target_feedback.v1", "heldout_size": 100, "prompt_template": "{prompt}",
            "decoding_limits": pb.DecodingLimits(max_new_tokens=1, max_samples_per_prompt=1, max_candidates_per_query=1),
            "upload_limits": pb.UploadLimits(max_checkpoint_bytes=1, max_chunk_bytes=1)}
    named = pb.GetInfoResponse(verifier_kind=pb.VERIFIER_KIND_NAMED, **base)
    assert any("verifier_name is empty" in p for p in info_problems(named))
    named.verifier_name = "acme_last_number"
    assert not info_problems(named)
    broken = pb.GetInfoResponse(verifier_kind=pb.VERIFIER_KIND_EXACT_MATCH, chat_template="{% if %}", **base)
    assert any("chat_template does not parse" in p for p in info_problems(broken))
    orphan = pb.GetInfoResponse(verifier_kind=pb.VERIFIER_KIND_EXACT_MATCH, chat_format="chatml", **base)
    assert any("chat_template is empty" in p for p in info_problems(orphan))


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    return install_verifier_plugin(tmp_path_factory.mktemp("plugin"))


def test_an_owner_serves_with_its_own_verifier_plugin_and_nothing_it_raises_leaves(
    plugin_site, monkeypatch, tmp_path, data_dir, pki, tiny_checkpoint, capfd
):
    """acme_fragile raises on every row, quoting the (canary-laden) answer: every row scores 0, the
    release is made, and neither a response, an error nor a log line (the node's or the worker's)
    carries a canary."""
    import io

    from target_owner_node import logs

    log = io.StringIO()
    logs.configure(stream=log)
    try:
        _serve_with_the_fragile_plugin(plugin_site, monkeypatch, tmp_path, data_dir, pki, tiny_checkpoint)
    finally:
        logs.configure(enabled=False)
    captured = capfd.readouterr()
    assert "CANARY" not in log.getvalue() + captured.out + captured.err
    assert '"event": "rpc"' in log.getvalue()


def _serve_with_the_fragile_plugin(plugin_site, monkeypatch, tmp_path, data_dir, pki, tiny_checkpoint) -> None:
    with verifiers_from(plugin_site, monkeypatch):  # the spawned worker inherits sys.path
        config = make_config(tmp_path, data_dir, pki, data={"verifier": "acme_fragile"},
                             privacy={"enabled": False}, evaluation={"timeout_s": 300})
        with running_server(config) as running:
            info = info_response(running.node)
            assert (info.verifier_kind, info.verifier_name) == (pb.VERIFIER_KIND_NAMED, "acme_fragile")
            client = RecordingClient(running.port, pki)
            try:
                checkpoint = client.upload_dir(tiny_checkpoint).checkpoint_id
                result = client.evaluate([checkpoint], samples_per_prompt=2)
                assert result.results[0].accuracy == 0.0
                client.info()
            finally:
                client.close()
        assert_no_canary(client.received)
