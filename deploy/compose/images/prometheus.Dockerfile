# Prometheus from Debian (bookworm: 2.42) in place of Docker Hub's prom/prometheus, with that
# image's interface compose.yaml uses: the binary as entrypoint (compose gives the flags), the
# data in /prometheus as user nobody, `wget` for the health check.
ARG DEBIAN_IMAGE=localhost/z9-compose/debian:bookworm
FROM ${DEBIAN_IMAGE}

RUN apt-get update -q \
    && apt-get install -y -q prometheus wget \
    && rm -rf /var/lib/apt/lists/* \
    && install -d -o nobody -g nogroup /prometheus
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
