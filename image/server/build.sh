#!/usr/bin/env bash
# Build the image of the sandbox-mcp server itself (FROM scratch: the static
# server, the static agent, a CA bundle), with no registry.
#
#   image/server/build.sh [BINDIR]   build sandbox-mcp-server:<hash> from
#                                    BINDIR/sandbox-mcp and BINDIR/sandbox-agent
#                                    (default bin/, as `make server-image`
#                                    builds them); last stdout line is the tag
#
# <hash> is the first 12 hex digits of sha256(Dockerfile, build.sh, both
# binaries): a new binary gives a new tag. Both binaries must be static
# (CGO_ENABLED=0): the image has no C library. Needs a reachable docker engine
# and a CA bundle (CA_BUNDLE, default /etc/ssl/certs/ca-certificates.crt, from
# Debian's ca-certificates). All progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
root="$(cd "$here/../.." && pwd -P)"

die() { echo "server/build.sh: error: $*" >&2; exit 1; }
log() { echo "server/build.sh: $*" >&2; }

case "${1:-}" in
  -h|--help) sed -n '2,14p' "$here/build.sh" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
esac
bindir="${1:-$root/bin}"
bundle="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

for b in sandbox-mcp sandbox-agent; do
  [ -x "$bindir/$b" ] || die "$bindir/$b is missing: run \`make server-image\` (it builds both statically)"
  # A dynamically linked binary would not start in a FROM scratch image.
  if head -c 4096 "$bindir/$b" | grep -aq '/lib64/ld-linux\|/lib/ld-linux\|ld-musl'; then
    die "$bindir/$b is dynamically linked; build it with CGO_ENABLED=0 (\`make server-image\` does)"
  fi
done
[ -s "$bundle" ] || die "no CA bundle at $bundle: apt-get install ca-certificates (or set CA_BUNDLE)"

hash="$(cat "$here/Dockerfile" "$here/build.sh" "$bindir/sandbox-mcp" "$bindir/sandbox-agent" | sha256sum | cut -c1-12)"
tag="sandbox-mcp-server:$hash"

command -v docker >/dev/null 2>&1 || die "docker CLI not found"
docker version >/dev/null 2>&1 \
  || die "docker engine unreachable (is dockerd running, and may this user use its socket?)"

if docker image inspect "$tag" >/dev/null 2>&1; then
  log "$tag already exists"
  echo "$tag"
  exit 0
fi

ctx=""
cleanup() {
  local rc=$?
  [ -n "$ctx" ] && rm -rf "$ctx"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ctx="$(mktemp -d "${TMPDIR:-/tmp}/sandbox-mcp-server-image.XXXXXX")"
cp "$here/Dockerfile" "$ctx/Dockerfile"
cp "$bindir/sandbox-mcp" "$bindir/sandbox-agent" "$ctx/"
cp -L "$bundle" "$ctx/ca-certificates.crt"
echo 'sandbox-mcp:x:65532:65532:sandbox-mcp server:/tmp:/sbin/nologin' >"$ctx/passwd"
echo 'sandbox-mcp:x:65532:' >"$ctx/group"

log "building $tag"
docker build --rm --force-rm --pull=false \
    --label "io.sandbox-mcp.image=server" \
    --label "io.sandbox-mcp.source-hash=$hash" \
    -t "$tag" "$ctx" >&2 \
  || die "docker build failed"

log "built $tag ($(docker image inspect -f '{{.Size}}' "$tag") bytes)"
echo "$tag"
