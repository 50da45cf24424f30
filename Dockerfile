# memgate: multi-stage, non-root, read-only-root-filesystem friendly.
# Expects DATABASE_URL (a PostgreSQL with pgvector); writable state only under /data.
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/memgate
COPY pyproject.toml README.md ./
COPY service ./service
RUN /opt/memgate/bin/pip install --no-cache-dir .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /data memgate && mkdir -p /data \
    && chown memgate /data
COPY --from=build /opt/memgate /opt/memgate
COPY migrations /app/migrations
COPY policies /app/policies
COPY openapi.yaml /app/openapi.yaml
ENV PATH=/opt/memgate/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    MEMGATE_DATA_DIR=/data \
    MEMGATE_HOST=0.0.0.0 \
    MEMGATE_METRICS_HOST=0.0.0.0 \
    MEMGATE_JSON_LOGS=1 \
    MEMGATE_MIGRATIONS_DIR=/app/migrations \
    MEMGATE_POLICIES_DIR=/app/policies
USER 10001
# 9464: the Prometheus scrape (MEMGATE_METRICS_HOST/PORT); keep it off the Ingress.
EXPOSE 8080 9464
HEALTHCHECK CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz')"]
ENTRYPOINT ["memgate"]
CMD ["serve"]
