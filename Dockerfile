# tunnelgate data plane image.
#
# Read-only root filesystem: nothing is written at run time. pip compiles the byte code
# while installing, and PYTHONDONTWRITEBYTECODE keeps Python from trying to write more.
# The one writable path the process may use is /tmp, so mount an emptyDir there (the
# manifests in deploy/ do): temporary files and, with --workers N, prometheus-client's
# multiprocess directory (PROMETHEUS_MULTIPROC_DIR, kept under /tmp).
#
# cloudflared is not in this image: it runs as a sidecar container (deploy/).
#
# Two stages: the full python image has the C compiler that mypyc needs to compile the
# hot path (setup.py); the slim runtime image only receives the built wheel.
FROM python:3.11-bookworm AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /build
COPY pyproject.toml setup.py README.md ./
COPY routing/ routing/
COPY proxy/ proxy/
COPY tunnel/ tunnel/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

COPY --from=build /wheels /wheels
# One layer: install, drop the wheel, add the unprivileged user (UID/GID 10001, the
# runAsUser of the deploy/ manifests).
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 tunnelgate \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin tunnelgate

WORKDIR /
USER 10001:10001

# 8080 cluster entrance, 8081 config API + /healthz /readyz /metrics,
# 8082 tunnel entrance (bind it to loopback: only the cloudflared sidecar may reach it).
EXPOSE 8080 8081 8082
ENTRYPOINT ["tunnelgate"]
CMD ["serve"]
