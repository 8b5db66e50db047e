import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_stubs_match_proto():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_protos.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_stubs_import():
    from protocol.generated.target_feedback.v1 import target_feedback_pb2, target_feedback_pb2_grpc

    assert target_feedback_pb2.DESCRIPTOR.package == "target_feedback.v1"
    assert hasattr(target_feedback_pb2_grpc, "TargetFeedbackServiceStub")


def test_stubs_are_the_pinned_generators_and_load_on_protobuf_6_and_7():
    """6.33.5 gencode (grpcio-tools 1.81.1) loads on protobuf 6.33.5+ and 7.x: one environment
    holds our stubs and flwr 1.42 (protobuf<7). The stamps must not drift to a 7.x generator."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gen_protos
    finally:
        sys.path.pop(0)
    pb2 = (ROOT / "protocol/generated/target_feedback/v1/target_feedback_pb2.py").read_text()
    assert "# Protobuf Python Version: 6.33.5" in pb2
    assert gen_protos.committed_generator() == gen_protos.GENERATOR == "1.81.1"
    newer = pb2.replace("# Protobuf Python Version: 6.33.5", "# Protobuf Python Version: 7.35.1").replace(
        "PUBLIC,\n    6,\n    33,\n    5,\n", "PUBLIC,\n    7,\n    35,\n    1,\n")
    assert newer != pb2
    assert gen_protos.without_stamps(newer) == gen_protos.without_stamps(pb2)
