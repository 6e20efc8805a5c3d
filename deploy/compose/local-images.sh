#!/bin/sh
# Builds the images of compose.yaml from Debian, for a machine that reaches Debian's archive (and
# PyPI) but no image registry:
#
#   localhost/z9-compose/debian:bookworm      debootstrap --variant=minbase bookworm, imported
#   localhost/z9-compose/python:bookworm      + Debian's python3 (z9's Dockerfile, PYTHON_IMAGE)
#   localhost/z9-compose/postgres:bookworm    + Debian's postgresql (Z9_POSTGRES_IMAGE)
#   localhost/z9-compose/prometheus:bookworm  + Debian's prometheus (Z9_PROMETHEUS_IMAGE)
#   z9:${Z9_IMAGE_TAG:-latest}                z9's Dockerfile on that python
#
# Grafana and the tracing UI (Jaeger) have no Debian package: compose.yaml's profile `ui`, which
# deploy/compose/podman-compose.sh leaves out. Run as root, from anywhere:
#
#   deploy/compose/local-images.sh
#
# with podman (Debian's; CONTAINERS_CONF=deploy/compose/containers.conf unless set), or docker when
# there is no podman (Z9_COMPOSE_ENGINE=docker|podman chooses). The debootstrap'd root file system
# is kept as a tar file in Z9_COMPOSE_CACHE (default /var/cache/z9-compose) and made again only
# when missing (--refresh: again now); every image is rebuilt from the engine's layer cache, so a
# second run takes seconds.
set -eu

root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/deploy/compose"
suite=bookworm
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
security_mirror="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
cache="${Z9_COMPOSE_CACHE:-/var/cache/z9-compose}"
tag="${Z9_IMAGE_TAG:-latest}"
prefix=localhost/z9-compose

refresh=0
for arg in "$@"; do
  case "$arg" in
    --refresh) refresh=1 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "local-images.sh: unknown argument $arg (--refresh, --help)" >&2; exit 2 ;;
  esac
done

engine="${Z9_COMPOSE_ENGINE:-}"
if [ -z "$engine" ]; then
  if command -v podman >/dev/null 2>&1; then engine=podman
  elif command -v docker >/dev/null 2>&1; then engine=docker
  else echo "local-images.sh: neither podman nor docker is installed (apt-get install podman)" >&2; exit 1
  fi
fi
if [ "$engine" = podman ]; then
  export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
fi

say() { echo "local-images.sh: $*" >&2; }
exists() { "$engine" image inspect "$1" >/dev/null 2>&1; }
build() {  # build TAG DOCKERFILE CONTEXT [ARGS...]: from the layer cache when nothing changed
  build_tag="$1"; build_file="$2"; build_context="$3"; shift 3
  say "building $build_tag"
  "$engine" build --network host --tag "$build_tag" --file "$build_file" "$@" "$build_context" >&2
}

# The temporary folders of this run (a debootstrap target, the base image's build context), removed
# on exit whatever happens; their names are set here only.
tmp_rootfs=""
tmp_context=""
cleanup() {
  [ -z "$tmp_rootfs" ] || rm -rf "$tmp_rootfs"
  [ -z "$tmp_context" ] || rm -rf "$tmp_context"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 1. The Debian root file system, cached as a tar file.
rootfs_tar="$cache/debian-$suite-minbase.tar"
if [ "$refresh" = 1 ] || [ ! -s "$rootfs_tar" ]; then
  command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] \
    || { echo "local-images.sh: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
  mkdir -p "$cache"
  tmp_rootfs="$(mktemp -d "$cache/rootfs.XXXXXX")"
  say "debootstrap --variant=minbase $suite from $mirror (about a minute)"
  PATH="$PATH:/usr/sbin:/sbin" debootstrap --variant=minbase "$suite" "$tmp_rootfs/rootfs" "$mirror" \
    >"$tmp_rootfs/log" 2>&1 || { tail -20 "$tmp_rootfs/log" >&2; exit 1; }
  tar -C "$tmp_rootfs/rootfs" --numeric-owner -cf "$tmp_rootfs/rootfs.tar" .
  mv "$tmp_rootfs/rootfs.tar" "$rootfs_tar"  # whole or not at all: a run killed before leaves none
  refresh=1
fi

# 2. Imported as an image (again when the tar file was made again).
if [ "$refresh" = 1 ] || ! exists "$prefix/debian-rootfs:$suite"; then
  say "importing $rootfs_tar as $prefix/debian-rootfs:$suite"
  "$engine" import "$rootfs_tar" "$prefix/debian-rootfs:$suite" >/dev/null
fi

# 3. The Debian base: the host's own certificate authorities go in (a TLS-inspecting proxy).
tmp_context="$(mktemp -d)"
mkdir "$tmp_context/local-ca"
for ca in /usr/local/share/ca-certificates/*.crt; do
  if [ -f "$ca" ]; then cp "$ca" "$tmp_context/local-ca/"; fi
done
build "$prefix/debian:$suite" "$here/images/debian.Dockerfile" "$tmp_context" \
  --build-arg "ROOTFS=$prefix/debian-rootfs:$suite" \
  --build-arg "DEBIAN_MIRROR=$mirror" --build-arg "DEBIAN_SECURITY_MIRROR=$security_mirror"

# 4. Python, PostgreSQL and Prometheus from Debian's packages.
for name in python postgres prometheus; do
  build "$prefix/$name:$suite" "$here/images/$name.Dockerfile" "$here/images" \
    --build-arg "DEBIAN_IMAGE=$prefix/debian:$suite"
done

# 5. z9's own image, from its Dockerfile, on Debian's python (podman names it localhost/z9:TAG).
build "z9:$tag" "$root/Dockerfile" "$root" --build-arg "PYTHON_IMAGE=$prefix/python:$suite"

say "done; the images for compose.yaml (deploy/compose/podman-compose.sh sets the last two):"
echo "Z9_IMAGE_TAG=$tag"
echo "Z9_POSTGRES_IMAGE=$prefix/postgres:$suite"
echo "Z9_PROMETHEUS_IMAGE=$prefix/prometheus:$suite"
