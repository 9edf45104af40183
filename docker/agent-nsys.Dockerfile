# Optional: the agent with NVIDIA Nsight Systems (nsys) for the privileged GPU-metrics sampler
# (k8s/overlays/example-nsys). Download the nsight-systems-cli .deb for your CUDA version from
# NVIDIA and put it next to this file as nsight-systems-cli.deb, then:
#
#   docker build -f docker/agent-nsys.Dockerfile -t perftracker/agent-nsys:0.1.0 docker/
#
# NOT BUILT OR RUN on the development machines (no container engine, no GPU there).
ARG AGENT_IMAGE=perftracker/agent:0.1.0
FROM ${AGENT_IMAGE}
USER root
COPY nsight-systems-cli.deb /tmp/nsight-systems-cli.deb
RUN apt-get update \
    && apt-get install -y --no-install-recommends /tmp/nsight-systems-cli.deb \
    && rm -rf /var/lib/apt/lists/* /tmp/nsight-systems-cli.deb \
    && nsys --version
# nsys --gpu-metrics-devices needs CAP_SYS_ADMIN (the overlay runs this container privileged)
ENTRYPOINT ["perftracker"]
CMD ["agent"]
