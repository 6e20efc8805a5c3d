# The one z9 image: every service is `z9 <command>` (see compose.yaml for the commands).
#   docker build -t z9 .
#   docker run --rm z9 --help
# PYTHON_IMAGE: an image with python 3.11 and pip first on PATH; deploy/compose/local-images.sh
# passes one built from Debian's python3 where no image registry is reachable.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# uid 10001: the Kubernetes manifests run the pods as this user (runAsNonRoot, runAsUser).
RUN useradd --system --uid 10001 --create-home --home-dir /home/z9 --shell /usr/sbin/nologin z9 \
    && mkdir -p /var/lib/z9-sim && chown z9:z9 /var/lib/z9-sim

WORKDIR /app
# The dependencies first, in a layer of their own: a change to z9's code rebuilds from the COPY of
# the code on, without downloading them again.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
      > /tmp/dependencies.txt \
    && pip install -c constraints.txt -r /tmp/dependencies.txt && rm /tmp/dependencies.txt
# Only what the package needs (see pyproject.toml's package-dir; setup.py finds the packages); secrets and state stay out
# (.dockerignore).
COPY pyproject.toml setup.py README.md LICENSE constraints.txt ./
COPY z9 ./z9
COPY libs ./libs
COPY services ./services
COPY db ./db
COPY simulator ./simulator
COPY resources ./resources
# The versions the tests passed with (constraints.txt; regenerate it as its header says).
RUN pip install -c constraints.txt . && z9 --help >/dev/null

USER z9
WORKDIR /home/z9
ENTRYPOINT ["z9"]
CMD ["--help"]
