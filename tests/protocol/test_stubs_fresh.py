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
