# perftracker localizer image: the HTTP service, its sqlite store on /data, the kubernetes
# client (localizer/k8s/client.py) and the report viewer (`perftracker report`).
#
#   docker build -f docker/localizer.Dockerfile -t perftracker/localizer:0.1.0 .
#
# No torch: the localizer never imports it. torch, nvtx and psutil are base dependencies of the
# perftracker distribution for the training side and the node agent, so the package goes in with
# --no-deps and the localizer's own dependencies follow, with pyproject.toml's bounds.
# tests/system/test_images.py checks that list against pyproject.toml and runs the manifests'
# localizer command with only these packages importable.
# NOT BUILT OR RUN on the development machines (no container engine there).
FROM python:3.11-slim

# No PERFTRACKER_ROLE or PERFTRACKER_DISABLE: a process that never trains never starts detection
# (perftracker/runtime/activation.py), and loading the localizer says it does not train.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /opt/perftracker
COPY pyproject.toml README.md ./
COPY perftracker ./perftracker
COPY agent ./agent
COPY localizer ./localizer
RUN pip install --no-deps . \
    && pip install "numpy>=1.24" "aiohttp>=3.9" "prometheus_client>=0.20" "rich>=13" "kubernetes>=28" \
    && python -c "import perftracker.localizer.service.http_service, perftracker.localizer.k8s.client, perftracker.localizer.diagnose.localize, perftracker.cli.localizer, perftracker.cli.report, kubernetes, rich" \
    && ! python -c "import torch" 2>/dev/null

RUN groupadd --gid 10001 perftracker && useradd --uid 10001 --gid 10001 --no-create-home perftracker \
    && mkdir -p /data && chown 10001:10001 /data
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8765

ENTRYPOINT ["perftracker"]
CMD ["localizer", "--host", "0.0.0.0", "--port", "8765", "--store", "/data/localizer.sqlite"]
