# The stage image for GPU machines: CUDA, PyTorch (CUDA build), vLLM, and the project.
# Build from the repository root:  docker build -f infra/docker/train.Dockerfile -t posttrain-train .
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH HF_HOME=/cache/hf
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git build-essential ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv $VIRTUAL_ENV

WORKDIR /app
# Dependencies first (cached layer): vLLM pins the CUDA torch build it was compiled against.
COPY pyproject.toml README.md ./
RUN mkdir -p training operators sandbox plugins && touch training/__init__.py operators/__init__.py \
      sandbox/__init__.py plugins/__init__.py \
 && pip install --upgrade pip && pip install -e '.[gpu]' psycopg2-binary
COPY training training
COPY sandbox sandbox
COPY operators operators
COPY plugins plugins
ARG GIT_REV=unknown
ENV POSTTRAIN_GIT_REV=$GIT_REV
# Stages run as an unprivileged user; the sandbox drops further to nobody for model-written code.
RUN useradd --create-home --uid 1000 posttrain && mkdir -p /cache && chown posttrain /cache
USER posttrain
ENTRYPOINT []
CMD ["posttrain", "--help"]
