# syntax=docker/dockerfile:1
# Trainer node, CPU build: the compose demo's default trainer (see docs/DEPLOY.md).
#
#   docker build -f docker/trainer-cpu.Dockerfile -t trainer:cpu .
#   docker run -v ./trainer:/srv/trainer trainer:cpu train --config /srv/trainer/train.toml
#
# The same trainer as trainer.Dockerfile without CUDA and vLLM: rollouts with the transformers
# engine on CPU (the tiny policy, or a small model of your own). The trainer's client
# certificate, key and the OWNER's CA certificate are mounted at run time (/srv/trainer/tls,
# read-only); nothing secret is in the image. Neither the owner's code nor the lab is installed.

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
COPY trainer_node ./trainer_node
# Extras: parquet (prompt sets may be parquet). Checked against pyproject.toml by
# tests/deploy/test_images.py.
RUN pip install ".[parquet]"

FROM python:3.11-slim-bookworm
RUN groupadd --system --gid 10001 trainer \
 && useradd --system --uid 10001 --gid trainer --create-home --home-dir /home/trainer \
        --shell /usr/sbin/nologin trainer \
 && mkdir -p /srv/trainer/runs /srv/trainer/tls \
 && chown trainer:trainer /srv/trainer/runs
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    MPLCONFIGDIR=/tmp/matplotlib
# Numeric, so Kubernetes runAsNonRoot can verify it; own the runs volume as 10001.
USER 10001:10001
WORKDIR /srv/trainer
VOLUME ["/srv/trainer/runs"]
ENTRYPOINT ["trainer-node"]
CMD ["--help"]
