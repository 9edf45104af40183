# perftracker agent image: the node agent (sidecar) and, for the example Job, the training
# container too (torch CPU build; the demo job, perftracker/examples/train.py, under /opt/perftracker).
#
#   docker build -f docker/agent.Dockerfile -t perftracker/agent:0.1.0 .
#
# GPU training images: build FROM your own CUDA/torch image instead and `pip install
# "perftracker-ml[gpu]"` (or a path install of this repository) into it; the agent sidecar itself needs no GPU build of torch.
# No PERFTRACKER_ROLE here: the trainer container runs this image too. The sidecar's command is the
# `perftracker` console script, which says it is perftracker's own process (perftracker/role.py).
# NOT BUILT OR RUN on the development machines (no container engine there).
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PERFTRACKER_RUN_DIR=/var/run/perftracker

# torch first, from the CPU index, so that no resolver pulls a CUDA build
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

WORKDIR /opt/perftracker
COPY pyproject.toml README.md ./
COPY perftracker ./perftracker
COPY agent ./agent
COPY localizer ./localizer
# The base install carries the agent, its embedded localizer and --metrics-port (prometheus_client);
# "gpu": NVML. tests/system/test_images.py runs every container command of k8s/ with only what this
# line installs importable.
RUN pip install ".[gpu]" && python -c "import perftracker, perftracker.agent.summarize.summarizer, prometheus_client, pynvml"

RUN groupadd --gid 10001 perftracker && useradd --uid 10001 --gid 10001 --no-create-home perftracker \
    && mkdir -p /var/run/perftracker && chown 10001:10001 /var/run/perftracker
USER 10001:10001

ENTRYPOINT ["perftracker"]
CMD ["agent"]
