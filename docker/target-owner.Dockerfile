# syntax=docker/dockerfile:1
# Target-owner node, CPU build (see docs/DEPLOY.md).
#
#   docker build -f docker/target-owner.Dockerfile -t target-owner:cpu .
#
# Runs with a READ-ONLY root filesystem: the only writable places are the storage volume
# (/srv/owner/storage: ledger, audit log, checkpoints) and a tmpfs at /tmp. Nothing secret
# is in the image: config.toml, the held-out data and the TLS files are mounted read-only
# at run time (/srv/owner/config.toml, /srv/owner/data, /srv/owner/tls).
# The trainer's code (trainer_node/) is deliberately not installed.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, from the PyTorch CPU wheel index: PyPI's Linux torch wheel is the CUDA build
# and would pull gigabytes of NVIDIA libraries. Same pin as scripts/install.sh.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY rlvr_core ./rlvr_core
COPY target_owner_node ./target_owner_node
# Extras: parquet (held-out data may be parquet). Kept in step with pyproject.toml by
# tests/deploy/test_images.py.
RUN pip install ".[parquet]"

FROM python:3.11-slim-bookworm
RUN groupadd --system --gid 10001 owner \
 && useradd --system --uid 10001 --gid owner --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin owner \
 && mkdir -p /srv/owner/storage /srv/owner/data /srv/owner/tls \
 && chown owner:owner /srv/owner/storage
COPY --from=build /opt/venv /opt/venv
# Every cache a library might write goes to the /tmp tmpfs; models are never downloaded.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/cache \
    HF_HOME=/tmp/hf \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor
# Numeric, so Kubernetes runAsNonRoot can verify it; own the storage volume and key files as 10001.
USER 10001:10001
WORKDIR /srv/owner
VOLUME ["/srv/owner/storage"]
# 50051: the mTLS service (publish it to the trainer only). 50052: plaintext health only,
# bound to loopback by the config; not published.
EXPOSE 50051
# grpc.health.v1 on server.health_address: NOT_SERVING while draining after SIGTERM.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-m", "target_owner_node.healthcheck", "--config", "/srv/owner/config.toml"]
# SIGTERM: health NOT_SERVING, in-flight evaluations finish, exit 0. Give it
# server.shutdown_grace_s + drain_delay_s (docker stop -t / compose stop_grace_period).
STOPSIGNAL SIGTERM
ENTRYPOINT ["target-owner-node"]
CMD ["serve", "--config", "/srv/owner/config.toml"]
