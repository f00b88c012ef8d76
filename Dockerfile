# MergePipe HTTP API: `mergepipe serve` with settings from MERGEPIPE_* variables.
# Build:  docker build -t mergepipe .
#         (--build-arg TORCH_INDEX_URL=<a wheel index of CPU builds> keeps torch CPU-only;
#          without it torch comes from pip's configured index)
# Run:    docker compose up   (see docker-compose.yml for volumes and settings)

# -- builder: the wheel, from the build context (the package is src/mergepipe/; the schema,
#    migrations and SQL files travel inside it as package data)
FROM python:3.11-slim AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# gcc builds the fused block kernels (src/mergepipe/core/_fused.c) into the wheel; the final image
# needs no compiler. The slim image already has Python's headers.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY . /src
RUN pip wheel --no-deps --wheel-dir /dist . \
    && python -m zipfile -l /dist/mergepipe-*.whl | grep -q "mergepipe/core/_fused"

# -- final: the wheel installed into site-packages; no checkout in the image
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

ARG TORCH_INDEX_URL=
# optional extras of the wheel: `cluster` (psycopg) for a PostgreSQL catalog and workers
ARG EXTRAS=

# torch first and alone: the largest layer, rebuilt only when its pin changes.
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==2.13.0"

COPY --from=builder /dist/ /tmp/dist/
RUN pip install /tmp/dist/mergepipe-*.whl \
    && if [ -n "$EXTRAS" ]; then pip install "$(ls /tmp/dist/mergepipe-*.whl)[$EXTRAS]"; fi \
    && rm -rf /tmp/dist \
    && useradd --create-home --uid 1000 mergepipe \
    && mkdir -p /data/catalog /data/models /data/outputs \
    && chown -R mergepipe:mergepipe /data/catalog /data/outputs

ENV MERGEPIPE_CATALOG=/data/catalog/mergepipe.duckdb \
    MERGEPIPE_DATA_ROOTS=/data/models \
    MERGEPIPE_OUTPUT_ROOT=/data/outputs \
    MERGEPIPE_WORKERS=2

USER mergepipe
WORKDIR /data
EXPOSE 8000
VOLUME ["/data/catalog", "/data/outputs"]

HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status == 200 else 1)"]

# SIGTERM stops it cleanly: running jobs get MERGEPIPE_SHUTDOWN_GRACE_S (30 s), exit status 0;
# jobs still queued resume at the next start.
STOPSIGNAL SIGTERM
CMD ["mergepipe", "serve", "--host", "0.0.0.0", "--port", "8000"]
