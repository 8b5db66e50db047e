# syntax=docker/dockerfile:1
# Trainer node: GRPO with vLLM rollouts on CUDA (see docs/DEPLOY.md).
#
#   docker build -f docker/trainer.Dockerfile -t trainer:gpu .
#   docker run --gpus all -v ./trainer:/srv/trainer trainer:gpu train --config /srv/trainer/train.toml
#
# The trainer's client certificate, key and the OWNER's CA certificate are mounted at run
# time (/srv/trainer/tls, read-only); nothing secret is in the image. Only the trainer's
# packages are installed (protocol, rlvr_core, trainer_node): neither the target owner's code
# nor the lab (simulate, bench) is in the image, and the build context excludes both
# (trainer.Dockerfile.dockerignore). `trainer-node simulate` and `bench` say so and what to
# install; rehearse them from a checkout of the whole project.

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
COPY trainer_node ./trainer_node
# Extras: gpu (vLLM and the CUDA torch it pins) and parquet. Checked against pyproject.toml
# by tests/deploy/test_images.py.
RUN pip install ".[gpu,parquet]"

FROM ${CUDA_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 trainer \
 && useradd --system --uid 10001 --gid trainer --create-home --home-dir /home/trainer \
        --shell /usr/sbin/nologin trainer \
 && mkdir -p /srv/trainer/runs /srv/trainer/tls \
 && chown trainer:trainer /srv/trainer/runs
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1
# Numeric, so Kubernetes runAsNonRoot can verify it; own the storage volume and key files as 10001.
USER 10001:10001
WORKDIR /srv/trainer
VOLUME ["/srv/trainer/runs"]
ENTRYPOINT ["trainer-node"]
CMD ["--help"]
