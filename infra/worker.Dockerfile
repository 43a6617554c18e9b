# The Duetime worker image: `duetime worker --tier T` on Fargate (arm64). Built by `cdk deploy` from the
# repository root, reduced by infra/constructs/executors.py to pyproject.toml, README.md and the core package.
FROM public.ecr.aws/docker/library/python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/duetime
COPY pyproject.toml README.md ./
COPY layers/core/python/duetime ./layers/core/python/duetime
# tzdata: zoneinfo's database on slim images, as in the Lambda layer
RUN pip install . tzdata && rm -rf /opt/duetime/build

# Tasks run as this unprivileged user, in its home; they get no AWS credentials from the worker.
RUN useradd --create-home --uid 10001 duetime
USER duetime
WORKDIR /home/duetime

ENTRYPOINT ["duetime"]
CMD ["worker", "--tier", "small"]
