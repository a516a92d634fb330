# The perftest sample's image (`make sample-image SAMPLE=perftest`): ib_write_bw and the verbs
# providers from Debian's packages, nothing else. The Job sources its NCCL and GID settings from
# the file its init container (the plugin image's podenv) writes, with `sh`.
ARG BASE=debian:bookworm-slim
FROM $BASE
RUN apt-get update \
 && apt-get install -y --no-install-recommends perftest ibverbs-providers rdmacm-utils \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*
CMD ["ib_write_bw", "--help"]
