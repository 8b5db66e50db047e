"""`python -m target_owner_node.healthcheck`: a grpc_health_probe for the owner's node.

Exit 0 when the node reports SERVING, 1 otherwise (not serving, draining after SIGTERM,
unreachable, timed out) — the contract of Docker's HEALTHCHECK and Kubernetes exec probes.

    python -m target_owner_node.healthcheck --config /srv/owner/config.toml   # server.health_address
    python -m target_owner_node.healthcheck --address 127.0.0.1:50052         # plaintext health port
    python -m target_owner_node.healthcheck --address owner:50051 --ca OWNER_CA --cert C --key K
                                                                               # over mTLS

The plaintext form is for probes inside the owner's container or host: the mTLS port needs
a client certificate from the trainer's CA, which the owner does not hold.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING, NOT_SERVING = 0, 1


def check(
    address: str,
    service: str = "",
    timeout_s: float = 3.0,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
    server_name: str | None = None,
) -> tuple[int, str]:
    """Ask `address` for the health of `service` ('' = the whole server). -> (exit code, status text)."""
    if ca is not None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca.read_bytes(),
            private_key=key.read_bytes() if key else None,
            certificate_chain=cert.read_bytes() if cert else None,
        )
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        channel = grpc.secure_channel(address, credentials, options=options)
    else:
        channel = grpc.insecure_channel(address)
    try:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
        )
    except grpc.RpcError as error:
        return NOT_SERVING, f"unreachable: {error.code().name}"
    finally:
        channel.close()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return (SERVING if response.status == health_pb2.HealthCheckResponse.SERVING else NOT_SERVING), status


def address_from_config(config_path: Path) -> str:
    """The health-only address of a node config (server.health_address), port 0 refused."""
    from target_owner_node.config import load_config, split_address

    config = load_config(config_path)
    address = config.server.health_address
    if address is None:
        raise ValueError(
            f"{config_path}: server.health_address is not set; add e.g. health_address = \"127.0.0.1:50052\" "
            "under [server], or pass --address"
        )
    host, port = split_address(address)
    if port == 0:
        raise ValueError(f"{config_path}: server.health_address has port 0; probes need a fixed port")
    if host in ("0.0.0.0", "::", ""):
        address = f"127.0.0.1:{port}"  # a wildcard bind is reachable on loopback
    return address


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m target_owner_node.healthcheck",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", type=Path, help="node config; probes server.health_address")
    where.add_argument("--address", metavar="HOST:PORT", help="address to probe")
    parser.add_argument("--service", default="", help="service name ('' = the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    parser.add_argument("--ca", type=Path, help="CA that signed the server certificate (enables TLS)")
    parser.add_argument("--cert", type=Path, help="client certificate (mTLS)")
    parser.add_argument("--key", type=Path, help="client key (mTLS)")
    parser.add_argument("--server-name", help="TLS name to verify when the address is not in the certificate")
    args = parser.parse_args(argv)
    try:
        address = args.address or address_from_config(args.config)
    except ValueError as error:  # ConfigError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return NOT_SERVING
    code, status = check(
        address, args.service, args.timeout, args.ca, args.cert, args.key, args.server_name
    )
    print(f"{address}: {status}")
    return code


if __name__ == "__main__":
    sys.exit(main())
