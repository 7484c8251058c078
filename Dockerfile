# The heterotrain operator. No torch: the operator never trains (the `runtime` extra is left out).
# Build from the repository root:  docker build -t heterotrain/operator:0.1.0 .
# BASE_IMAGE may be any Debian-based image with Python >= 3.11 as `python` (with venv) and useradd;
# `make images` builds one from Debian packages where no container registry can be reached.
ARG BASE_IMAGE=python:3.11.11-slim-bookworm
FROM ${BASE_IMAGE}
# Where pip finds packages, for a build behind a package mirror (unset: PyPI).
ARG PIP_INDEX_URL
# pip compiles bytecode as it installs: nothing is written at run time, so the root filesystem can be
# read-only (HOME points at the /tmp emptyDir the chart mounts).
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/heterotrain/bin:$PATH \
    HOME=/tmp
RUN groupadd --system --gid 10001 heterotrain \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin heterotrain
# Dependencies first, read from pyproject.toml alone, so that a change to the sources reuses this layer.
COPY pyproject.toml /src/
RUN python -m venv /opt/heterotrain \
    && python -c "import tomllib; print('\n'.join(tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY README.md /src/
COPY operator/hetero_operator /src/operator/hetero_operator
COPY trainer_image/hetero_runtime /src/trainer_image/hetero_runtime
RUN pip install --no-cache-dir /src \
    && rm -rf /src
# Numeric, so the kubelet can check runAsNonRoot.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080 8443
ENTRYPOINT ["heterotrain", "operator"]
