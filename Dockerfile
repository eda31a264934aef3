# syntax=docker/dockerfile:1
# telegram-intake: one image for every role (run, serve, worker, migrate, demo-downstream).
#
#   docker build -t telegram-intake .
#   docker run --rm -p 8080:8080 -v intake-var:/app/var \
#     -e INTAKE_SECRET_TOKEN=... -e INTAKE_DOWNSTREAM_URL=https://bot.example/hook telegram-intake
#
# The default command is `run` (intake and workers in one process, SQLite under /app/var,
# migrated at start). docker-compose.yml runs the same image on PostgreSQL as separate
# `migrate`, `serve` and `worker` services.

ARG PYTHON_VERSION=3.12

# --- build: the project's wheel, its dependencies in a virtualenv ----------------------------
FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# Dependencies first, from requirements.lock alone (pyproject.toml's dependencies, resolved for
# this Python on Linux, each pinned with its files' hashes; the README says how to remake it),
# so that this layer is rebuilt only when the lock changes and every build installs the same
# files. Each ships wheels for linux amd64 and arm64: no compiler is needed here either.
COPY requirements.lock ./
RUN pip install --require-hashes --only-binary=:all: -r requirements.lock

# The project itself as wheels (the service, and the downstream kit it shares its wire
# messages with, kit/python), installed with --target into /app, where alembic.ini and
# alembic/ are copied below, so that `alembic upgrade head` works from /app as from a
# checkout. (`telegram-intake migrate` needs neither: the wheel carries the migrations as
# app.migrations, built from alembic/.)
COPY pyproject.toml README.md ./
COPY kit/python ./kit/python
COPY app ./app
COPY alembic ./alembic
RUN pip wheel --no-deps --wheel-dir /dist ./kit/python . \
 && pip install --no-deps --target /app /dist/telegram_intake-*.whl /dist/telegram_intake_kit-*.whl

# --- final: slim Python, no build tools, a non-root user -------------------------------------
FROM python:${PYTHON_VERSION}-slim AS final
RUN groupadd --system --gid 10001 intake \
 && useradd --system --uid 10001 --gid intake --home-dir /app --no-create-home \
      --shell /usr/sbin/nologin intake
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
WORKDIR /app
# `alembic upgrade head` works from /app as it does from a checkout; `examples/` serves
# `uvicorn examples.effects_bot.bot:app`.
COPY alembic.ini ./
COPY alembic ./alembic
COPY examples ./examples
# Everything above belongs to root and is read-only to the service; var/ (the SQLite default,
# ./var/intake.db) is the one place it writes. Mount a volume there to keep it.
RUN mkdir var && chown intake:intake var

# /app/bin holds the `telegram-intake` script that pip --target wrote; PYTHONPATH makes /app's
# packages (app, examples) importable from anywhere.
ENV PATH=/app/bin:/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    INTAKE_HOST=0.0.0.0 \
    INTAKE_PORT=8080
USER 10001:10001
EXPOSE 8080

# Standard library only: slim images have no curl. A service started with `--port` other
# than INTAKE_PORT, or one that serves no HTTP (worker), overrides or disables this.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('INTAKE_PORT', '8080') + '/healthz', timeout=4)"]

ENTRYPOINT ["telegram-intake"]
CMD ["run"]
