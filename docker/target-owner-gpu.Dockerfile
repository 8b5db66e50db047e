# syntax=docker/dockerfile:1
# Target-owner node, GPU build: evaluation with vLLM or transformers on CUDA
# (set [evaluation] engine = "vllm" or device = "cuda:0"). See docs/DEPLOY.md.
#
#   docker build -f docker/target-owner-gpu.Dockerfile -t target-owner:gpu .
#   docker run --gpus all --read-only --tmpfs /tmp ...   (or compose with the gpu profile)
#
# Same filesystem contract as the CPU image: read-only root, writable storage volume and
# /tmp tmpfs only, no secrets in the image. The trainer's code is not installed.

ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

FROM ${CUDA_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY rlvr_core ./rlvr_core
COPY target_owner_node ./target_owner_node
# Extras: gpu (vLLM, which brings the CUDA torch build it was compiled against) and parquet.
# torch is not pinned here: vLLM pins its own torch. Checked by tests/deploy/test_images.py.
RUN pip install ".[gpu,parquet]"

FROM ${CUDA_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 owner \
 && useradd --system --uid 10001 --gid owner --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin owner \
 && mkdir -p /srv/owner/storage /srv/owner/data /srv/owner/tls \
 && chown owner:owner /srv/owner/storage
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/cache \
    HF_HOME=/tmp/hf \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    VLLM_CACHE_ROOT=/tmp/vllm \
    VLLM_NO_USAGE_STATS=1 \
    TRITON_CACHE_DIR=/tmp/triton \
    MPLCONFIGDIR=/tmp/matplotlib \
    TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor
# Numeric, so Kubernetes runAsNonRoot can verify it; own the storage volume and key files as 10001.
USER 10001:10001
WORKDIR /srv/owner
VOLUME ["/srv/owner/storage"]
EXPOSE 50051
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-m", "target_owner_node.healthcheck", "--config", "/srv/owner/config.toml"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["target-owner-node"]
CMD ["serve", "--config", "/srv/owner/config.toml"]
