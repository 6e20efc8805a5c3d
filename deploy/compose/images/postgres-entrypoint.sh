#!/bin/sh
# The postgres image of local-images.sh: on the first start (an empty $PGDATA) make the cluster with
# superuser $POSTGRES_USER (password $POSTGRES_PASSWORD) and database $POSTGRES_DB, as Docker Hub's
# postgres image does; then run the server in the foreground.
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "postgres-entrypoint: POSTGRES_PASSWORD is not set: no cluster without a password" >&2
    exit 1
  fi
  case "$POSTGRES_USER$POSTGRES_DB" in
    *[!A-Za-z0-9_]*) echo "postgres-entrypoint: POSTGRES_USER and POSTGRES_DB: letters, digits and _ only" >&2
                     exit 1 ;;
  esac
  pwfile="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --pgdata="$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" --encoding=UTF8 \
    --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
  if [ "$POSTGRES_DB" != postgres ]; then
    echo "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"$POSTGRES_USER\"" | postgres --single -D "$PGDATA" postgres >/dev/null
  fi
  echo "postgres-entrypoint: made the cluster in $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
fi
exec postgres -D "$PGDATA" "$@"
