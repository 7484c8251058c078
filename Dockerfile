# The heterotrain operator. No torch: the operator never trains (the `runtime` extra is left out).
# Build from the repository root:  docker build -t heterotrain/operator:0.1.0 .

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/hetero_operator ./operator/hetero_operator
COPY trainer_image/hetero_runtime ./trainer_image/hetero_runtime
# The project into its own virtual environment, which the final stage copies whole.
RUN python -m venv /opt/heterotrain \
    && /opt/heterotrain/bin/pip install --no-cache-dir . \
    && /opt/heterotrain/bin/python -m compileall -q /opt/heterotrain/lib

FROM python:3.11.11-slim-bookworm
COPY --from=build /opt/heterotrain /opt/heterotrain
# Bytecode was compiled at build time: nothing is written at run time, so the root filesystem can be
# read-only (HOME points at the /tmp emptyDir the chart mounts).
ENV PATH=/opt/heterotrain/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
RUN groupadd --system --gid 10001 heterotrain \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin heterotrain
# Numeric, so the kubelet can check runAsNonRoot.
USER 10001:10001
EXPOSE 8080 8443
ENTRYPOINT ["heterotrain", "operator"]
