#!/usr/bin/env bash
# Build the small sandbox-mcp test image (static busybox, FROM scratch).
#
#   image/testimage/build.sh              build sandbox-mcp-test:<hash> if it is
#                                         missing; last stdout line is the tag
#   image/testimage/build.sh --print-tag  print the tag and exit (no docker)
#
# <hash> is the first 12 hex digits of sha256(Dockerfile bytes + build.sh
# bytes), the same value testimage.Tag() computes from the embedded copies.
# Needs: a reachable docker engine and Debian's busybox-static (its /bin/busybox
# is copied into the image; BUSYBOX=/path overrides it with another static
# busybox). No registry, no network. All progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"

die() { echo "testimage/build.sh: error: $*" >&2; exit 1; }
log() { echo "testimage/build.sh: $*" >&2; }

hash="$(cat "$here/Dockerfile" "$here/build.sh" | sha256sum | cut -c1-12)"
tag="sandbox-mcp-test:$hash"

case "${1:-}" in
  --print-tag) echo "$tag"; exit 0 ;;
  "") ;;
  -h|--help) sed -n '2,12p' "$here/build.sh" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
  *) die "unknown argument: $1 (usage: build.sh [--print-tag])" ;;
esac

command -v docker >/dev/null 2>&1 || die "docker CLI not found"
docker version >/dev/null 2>&1 \
  || die "docker engine unreachable (is dockerd running, and may this user use its socket?)"

if docker image inspect "$tag" >/dev/null 2>&1; then
  log "$tag already exists"
  echo "$tag"
  exit 0
fi

if [ -n "${BUSYBOX:-}" ]; then
  busybox="$BUSYBOX"
else
  busybox=/bin/busybox
  # The dynamic busybox package also installs /bin/busybox, and would not run
  # in a FROM scratch image: insist on the static one.
  if ! command -v dpkg-query >/dev/null 2>&1 \
     || [ "$(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null)" != "install ok installed" ]; then
    die "Debian's static busybox is needed: apt-get install busybox-static (or set BUSYBOX=/path/to/static/busybox)"
  fi
fi
[ -f "$busybox" ] && [ -x "$busybox" ] || die "$busybox is not an executable file"

ctx=""
cleanup() {
  local rc=$?
  [ -n "$ctx" ] && rm -rf "$ctx"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ctx="$(mktemp -d "${TMPDIR:-/tmp}/sandbox-mcp-testimage.XXXXXX")"
cp "$here/Dockerfile" "$ctx/Dockerfile"
cp -L "$busybox" "$ctx/busybox"

log "building $tag from $busybox"
docker build --rm --force-rm --pull=false \
    --label "io.sandbox-mcp.source-hash=$hash" \
    -t "$tag" "$ctx" >&2 \
  || die "docker build failed"

log "built $tag ($(docker image inspect -f '{{.Size}}' "$tag") bytes)"
echo "$tag"
