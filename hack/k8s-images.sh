#!/usr/bin/env bash
# Build the images the Kubernetes backend needs and load them into a test
# node's containerd (no registry: docker save | ctr import; pods use
# imagePullPolicy Never there).
#
#   hack/k8s-images.sh [IMAGE...]   build sandbox-mcp-agent:<hash> and the
#                                   server's image sandbox-mcp-server:<hash>
#                                   (image/server), then load both and each IMAGE (default: the test image and,
#                                   if built, the default sandbox image) into the
#                                   node; the last stdout line is the agent tag
#   hack/k8s-images.sh --build-only build the agent and server images only (for a registry)
#
# The agent image is FROM scratch with the static sandbox-agent at
# /sandbox-agent; <hash> is the first 12 hex digits of the binary's sha256, so
# a changed agent gets a new tag. Env: K8S_NODE_DIR (default /var/tmp/k8s-node),
# GO (default go). All progress goes to stderr.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
W=${K8S_NODE_DIR:-/var/tmp/k8s-node}
SOCK=$W/containerd/containerd.sock
GO=${GO:-go}
log() { echo "k8s-images.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

build_only=false
if [ "${1:-}" = "--build-only" ]; then build_only=true; shift; fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
version="$(git -C "$root" describe --tags --always --dirty 2>/dev/null || echo dev)"
( cd "$root" && CGO_ENABLED=0 "$GO" build -trimpath \
    -ldflags "-s -w -X github.com/sandbox-mcp/sandbox-mcp/agent.version=$version" \
    -o "$tmp/sandbox-agent" ./cmd/sandbox-agent )
hash="$(sha256sum "$tmp/sandbox-agent" | cut -c1-12)"
agent="sandbox-mcp-agent:$hash"
if ! docker image inspect "$agent" >/dev/null 2>&1; then
  printf 'FROM scratch\nCOPY sandbox-agent /sandbox-agent\nUSER 65534:65534\nENTRYPOINT ["/sandbox-agent"]\n' > "$tmp/Dockerfile"
  docker build -q --label io.sandbox-mcp.agent=1 -t "$agent" "$tmp" >&2
  log "built $agent"
fi
# The server's own image (deploy/kubernetes/ runs it): the static server
# beside the same agent, FROM scratch (image/server/build.sh).
( cd "$root" && CGO_ENABLED=0 "$GO" build -trimpath \
    -ldflags "-s -w -X main.version=$version -X github.com/sandbox-mcp/sandbox-mcp/agent.version=$version" \
    -o "$tmp/sandbox-mcp" ./cmd/sandbox-mcp )
server="$(bash "$root/image/server/build.sh" "$tmp" | tail -1)"
if $build_only; then echo "$agent"; exit 0; fi

[ -S "$SOCK" ] || die "no test node containerd at $SOCK: run ../shared/tools/k8s/k8s-node.sh all (or up) first"
CTR=$W/bin/ctr
command -v "$CTR" >/dev/null 2>&1 || CTR=ctr
images=("$@")
if [ ${#images[@]} -eq 0 ]; then
  images=("$(bash "$root/image/testimage/build.sh" --print-tag)")
  def="$(cd "$root" && "$GO" run ./cmd/sandbox-mcp image 2>/dev/null | tail -1 || true)"
  if [ -n "$def" ] && docker image inspect "$def" >/dev/null 2>&1; then images+=("$def"); fi
fi
for img in "$agent" "$server" "${images[@]}"; do
  docker image inspect "$img" >/dev/null 2>&1 || die "image $img is not built (make image testimage)"
  ref="docker.io/library/$img"
  case "$img" in */*) ref="$img" ;; esac
  if "$CTR" --address "$SOCK" -n k8s.io images ls -q "name==$ref" | grep -q .; then
    log "$img already on the node"
    continue
  fi
  docker save "$img" | "$CTR" --address "$SOCK" -n k8s.io images import - >&2
  log "loaded $img"
done
echo "$agent"
