# Python from Debian (python3 3.11 of bookworm) in place of Docker Hub's python:3.11-slim-bookworm,
# for z9's Dockerfile (build argument PYTHON_IMAGE): a virtual environment first on PATH gives the
# same `python` and `pip` that image has, and keeps pip off Debian's own packages (PEP 668).
ARG DEBIAN_IMAGE=localhost/z9-compose/debian:bookworm
FROM ${DEBIAN_IMAGE}

RUN apt-get update -q \
    && apt-get install -y -q python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/python
# pip of the virtual environment trusts the system's certificate authorities (the host's included).
ENV PATH=/opt/python/bin:$PATH \
    VIRTUAL_ENV=/opt/python \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
