#!/usr/bin/env bash
# Build the sandbox-mcp default sandbox image without any image registry.
#
#   image/build.sh              build sandbox-mcp:<hash> if it is missing; the
#                               last line on stdout is the tag
#   image/build.sh --print-tag  print the tag and exit (no root, no docker)
#
# <hash> is the first 12 hex digits of sha256(Dockerfile bytes + build.sh bytes),
# the same value image.DefaultTag() computes from the embedded copies.
#
# How: debootstrap a minimal Debian bookworm rootfs from Debian's package
# archive, `docker import` it as sandbox-mcp-base:<hash>, then `docker build`
# image/Dockerfile on top of it. The base tag is removed again at the end (its
# layer lives on as the parent of the final image), and the rootfs is always
# removed. Needs: root, a reachable docker engine, debootstrap, and access to a
# Debian mirror (DEBIAN_MIRROR, default http://deb.debian.org/debian), and
# ~300 MB of scratch space (SANDBOX_MCP_BUILD_DIR, default /var/tmp).
# All progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"

SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# What agents expect (SPEC §5), plus less as git's pager. Their Depends are
# pulled in by debootstrap; Recommends are not.
PACKAGES=bash,coreutils,python3,git,curl,ca-certificates,tar,procps,less

die() { echo "build.sh: error: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

hash="$(cat "$here/Dockerfile" "$here/build.sh" | sha256sum | cut -c1-12)"
tag="sandbox-mcp:$hash"
base_tag="sandbox-mcp-base:$hash"

case "${1:-}" in
  --print-tag) echo "$tag"; exit 0 ;;
  "") ;;
  -h|--help) sed -n '2,18p' "$here/build.sh" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
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

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap needs it); try: sudo $here/build.sh"
command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found: apt-get install debootstrap"

# One build per tag at a time; a second caller waits, then finds the tag. (The
# empty lock file stays in /run/lock, which is cleared at boot.)
if command -v flock >/dev/null 2>&1 && [ -d /run/lock ]; then
  exec 9>"/run/lock/sandbox-mcp-image-$hash.lock"
  flock 9
  if docker image inspect "$tag" >/dev/null 2>&1; then
    log "$tag already exists"
    echo "$tag"
    exit 0
  fi
fi

workdir=""
made_base=0
cleanup() {
  local rc=$?
  set +e
  if [ -n "$workdir" ] && [ -d "$workdir" ]; then
    # debootstrap mounts /proc, /sys (and maybe /dev) inside the rootfs; if it
    # died half way they may still be there. Unmount deepest first, then never
    # let rm cross into another filesystem.
    awk -v p="$workdir/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo \
      | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
    rm -rf --one-file-system "$workdir"
  fi
  if [ "$made_base" = 1 ]; then
    docker image rm "$base_tag" >/dev/null 2>&1
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Not /tmp: it may be a tmpfs mounted noexec/nodev, which debootstrap cannot use.
workdir="$(mktemp -d "${SANDBOX_MCP_BUILD_DIR:-/var/tmp}/sandbox-mcp-rootfs.XXXXXX")"
rootfs="$workdir/rootfs"
mkdir "$rootfs"

start=$SECONDS
log "debootstrap $SUITE ($PACKAGES) from $MIRROR into $rootfs"
if ! debootstrap --variant=minbase --components=main --include="$PACKAGES" \
      "$SUITE" "$rootfs" "$MIRROR" >&2; then
  [ -f "$rootfs/debootstrap/debootstrap.log" ] && tail -n 30 "$rootfs/debootstrap/debootstrap.log" >&2
  die "debootstrap failed (is $MIRROR reachable?)"
fi

log "trimming the rootfs"
(
  cd "$rootfs"
  # Package caches and indexes: the sandbox has no network for apt anyway.
  rm -rf var/cache/apt/*.bin var/cache/apt/archives/*.deb var/cache/apt/archives/partial/* \
         var/lib/apt/lists/* var/cache/debconf/*-old var/lib/dpkg/*-old
  # Documentation, manuals, translations. Copyright files stay.
  find usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete
  find usr/share/doc -mindepth 1 -type d -empty -delete
  rm -rf usr/share/man/* usr/share/info/* usr/share/locale/* usr/share/lintian \
         usr/share/linda usr/share/bug
  # Logs and the host's identity that debootstrap copied in; docker provides
  # /etc/hosts, /etc/hostname and /etc/resolv.conf at run time.
  rm -rf var/log/* var/cache/ldconfig/aux-cache debootstrap
  : > etc/resolv.conf
  : > etc/hostname
  # Keep the same things out of images derived from this one.
  mkdir -p etc/dpkg/dpkg.cfg.d
  cat > etc/dpkg/dpkg.cfg.d/01-sandbox-mcp-nodoc <<'CFG'
# sandbox-mcp: keep derived images lean (see image/build.sh).
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-exclude=/usr/share/lintian/*
CFG
  # Strip setuid/setgid here too, so the Dockerfile's pass finds nothing and
  # does not copy those files into a second layer.
  find . -xdev -perm /6000 \( -type f -o -type d \) -exec chmod ug-s {} +
)

log "importing the rootfs as $base_tag"
made_base=1
tar -C "$rootfs" --numeric-owner --xattrs -c . \
  | docker import --message "sandbox-mcp debootstrap $SUITE minbase" - "$base_tag" >&2
rm -rf --one-file-system "$rootfs"

log "building $tag"
# A context holding only the Dockerfile: nothing else needs to be sent.
ctx="$workdir/ctx"
mkdir "$ctx"
cp "$here/Dockerfile" "$ctx/Dockerfile"
docker build --rm --force-rm --pull=false \
    --build-arg "BASE=$base_tag" \
    --label "io.sandbox-mcp.source-hash=$hash" \
    -t "$tag" "$ctx" >&2 \
  || die "docker build failed"

log "built $tag in $((SECONDS - start))s ($(docker image inspect -f '{{.Size}}' "$tag") bytes)"
echo "$tag"
