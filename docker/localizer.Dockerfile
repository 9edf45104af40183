# perftracker localizer image: the HTTP service, its sqlite store on /data, the kubernetes
# client (localizer/k8s/client.py) and the report viewer (`perftracker report`).
#
#   docker build -f docker/localizer.Dockerfile -t perftracker/localizer:0.1.0 .
#
# torch is a dependency of the perftracker distribution (the in-process side); the CPU build is
# installed to keep the image small. The localizer itself never imports it.
# NOT BUILT OR RUN on the development machines (no container engine there).
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PERFTRACKER_DISABLE=1

RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

WORKDIR /opt/perftracker
COPY pyproject.toml README.md ./
COPY perftracker ./perftracker
COPY agent ./agent
COPY localizer ./localizer
# tests/system/test_images.py runs the manifests' localizer command with only these extras importable.
RUN pip install ".[localizer,k8s]" && python -c "import perftracker.localizer.service.http_service, perftracker.localizer.k8s.client, perftracker.localizer.diagnose.localize"

RUN groupadd --gid 10001 perftracker && useradd --uid 10001 --gid 10001 --no-create-home perftracker \
    && mkdir -p /data && chown 10001:10001 /data
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8765

ENTRYPOINT ["perftracker"]
CMD ["localizer", "--host", "0.0.0.0", "--port", "8765", "--store", "/data/localizer.sqlite"]
