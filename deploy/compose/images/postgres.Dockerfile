# PostgreSQL from Debian (bookworm: PostgreSQL 15) in place of Docker Hub's postgres:16-bookworm,
# with the part of that image's interface compose.yaml uses: POSTGRES_USER, POSTGRES_PASSWORD and
# POSTGRES_DB make the cluster on first start, the data in /var/lib/postgresql/data (a volume),
# `pg_isready` for the health check, port 5432 with password (scram-sha-256) logins.
ARG DEBIAN_IMAGE=localhost/z9-compose/debian:bookworm
FROM ${DEBIAN_IMAGE}

# postgresql-common makes no cluster of its own: the entrypoint makes one in the volume.
RUN mkdir -p /etc/postgresql-common \
    && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf \
    && apt-get update -q \
    && apt-get install -y -q postgresql \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "$(ls -d /usr/lib/postgresql/*/bin | tail -1)" /usr/lib/postgresql/bin \
    && install -d -o postgres -g postgres -m 2775 /var/run/postgresql \
    && install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
