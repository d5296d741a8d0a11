# syntax=docker/dockerfile:1
# ElastiCo image: `elastico serve` (extender + webhook), `elastico agent` (node agent),
# and the runtime bundle (`elastico runtime-bundle /elastico`: elastico-run + the profiler
# shim) that an init container drops into a workload pod's shared volume.
#
#   docker build -t ghcr.io/elastico/elastico-extender:0.1.0 .
#
# Stage 1 compiles the wheel (C compiler for the LD_PRELOAD profiler shim; warnings are
# errors here, as in CI); stage 2 installs it without any compiler and runs as a non-root user.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY profiler_shim/ profiler_shim/
COPY elastico_extender/ elastico_extender/
ENV ELASTICO_SHIM_WERROR=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && pip wheel --wheel-dir /wheels /wheels/elastico_extender-*.whl

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="elastico-extender" \
      org.opencontainers.image.description="ElastiCo kube-scheduler extender, webhook, node agent and elastico-run" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-index --find-links /wheels /wheels/elastico_extender-*.whl \
    && rm -rf /wheels \
    && elastico runtime-bundle /opt/elastico \
    && groupadd --gid 65532 elastico \
    && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin elastico
# /opt/elastico/bin/elastico-run and /opt/elastico/lib: the same bundle the init container
# copies; kept in the image so `docker run ... cat` or a sidecar copy also work.
USER 65532:65532
EXPOSE 8888 8443 8444
ENTRYPOINT ["elastico"]
CMD ["serve", "--host=0.0.0.0"]
