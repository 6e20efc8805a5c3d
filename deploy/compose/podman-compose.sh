#!/bin/sh
# compose.yaml with podman, on the images deploy/compose/local-images.sh built from Debian:
#
#   deploy/compose/podman-compose.sh up -d
#   deploy/compose/podman-compose.sh ps
#   deploy/compose/podman-compose.sh run --rm api token --tenant me
#   deploy/compose/podman-compose.sh down            # -v: the volumes (the database) too
#
# Any podman-compose arguments pass through. It runs `podman-compose -f compose.yaml -f
# deploy/compose/podman.yaml` (why the second file: its comments) from the repository root, with
# - CONTAINERS_CONF=deploy/compose/containers.conf (unless set): runc, cgroupfs, no default ulimits;
# - the images of local-images.sh: Z9_POSTGRES_IMAGE, Z9_PROMETHEUS_IMAGE (unless set);
# - COMPOSE_PROFILES empty (unless set): Grafana and Jaeger (profile `ui`) have no Debian package;
# - the secrets of .env (or of the environment, which wins, as in compose) written as files into
#   .z9/compose-secrets/, which only the owner can enter.
# PODMAN_COMPOSE names the podman-compose to run (default: .venv/bin/podman-compose, the [test]
# extra's, else the one on PATH; 1.1 or later).
set -eu

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

export CONTAINERS_CONF="${CONTAINERS_CONF:-$root/deploy/compose/containers.conf}"
export Z9_POSTGRES_IMAGE="${Z9_POSTGRES_IMAGE:-localhost/z9-compose/postgres:bookworm}"
export Z9_PROMETHEUS_IMAGE="${Z9_PROMETHEUS_IMAGE:-localhost/z9-compose/prometheus:bookworm}"
export COMPOSE_PROFILES="${COMPOSE_PROFILES-}"

compose="${PODMAN_COMPOSE:-}"
if [ -z "$compose" ]; then
  if [ -x "$root/.venv/bin/podman-compose" ]; then compose="$root/.venv/bin/podman-compose"
  elif command -v podman-compose >/dev/null 2>&1; then compose=podman-compose
  else echo "podman-compose.sh: no podman-compose (.venv/bin/pip install podman-compose)" >&2; exit 1
  fi
fi
# 1.1 or later: profiles and `!override` (Debian bookworm's 1.0.3 has neither).
version="$("$compose" version 2>/dev/null | sed -n 's/^podman-compose version \([0-9.]*\).*/\1/p' | head -1)"
case "$version" in
  0.*|1.0|1.0.*|"") echo "podman-compose.sh: $compose is version ${version:-unknown}; 1.1 or later is needed" \
                         "(.venv/bin/pip install podman-compose, or PODMAN_COMPOSE=...)" >&2; exit 1 ;;
esac

# A value of .env: the last KEY=value line, quotes around it removed (compose's .env syntax for
# these plain values).
dotenv() {
  [ -f .env ] || return 0
  sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*//p" .env | tail -1 \
    | sed -e "s/^'\(.*\)'\$/\1/" -e 's/^"\(.*\)"$/\1/'
}

secrets=.z9/compose-secrets
(umask 077 && mkdir -p "$secrets")
chmod 0700 "$secrets"
# secret file <- variable (compose.yaml's `secrets:`); the files are world-readable inside that
# folder: z9 runs as uid 10001 in its containers and reads them through the bind mount.
for pair in sim_token_secret:Z9_SIM_TOKEN_SECRET pve_token_secret:Z9_PVE_TOKEN_SECRET \
            installation_key:Z9_INSTALLATION_KEY; do
  name="${pair%%:*}"; var="${pair#*:}"
  value="$(eval "printf '%s' \"\${$var-}\"")"
  [ -n "$value" ] || value="$(dotenv "$var")"
  rm -f "$secrets/$name"
  printf '%s' "$value" > "$secrets/$name"
  chmod 0444 "$secrets/$name"
done

exec "$compose" -f compose.yaml -f deploy/compose/podman.yaml "$@"
