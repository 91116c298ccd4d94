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
# archive, install the toolbox into it with apt in a chroot (bookworm with its
# updates and security updates, no recommended packages, no documentation),
# add the sandbox user, then `docker import` the rootfs as the image, applying
# the instructions of image/Dockerfile (ENV, LABEL, WORKDIR, USER, CMD) with
# --change. The rootfs is always removed. Needs: root, a reachable docker
# engine, debootstrap, access to a Debian mirror (DEBIAN_MIRROR, default
# http://deb.debian.org/debian; security updates come from
# DEBIAN_SECURITY_MIRROR, default http://deb.debian.org/debian-security, set it
# empty to go without) and about 1.1 GB of scratch space (SANDBOX_MCP_BUILD_DIR,
# default /var/tmp). All progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"

SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR-http://deb.debian.org/debian-security}"
# The toolbox agents expect of a development box. apt installs these and what
# they depend on, without Recommends (so libc6-dev, only recommended by gcc, is
# named; python3-munkres is named so that it, not python3-scipy, satisfies
# python3-fonttools' "python3-scipy | python3-munkres" (matplotlib needs
# fonttools): scipy brings pythran, and with it the boost headers, a BLAS
# development kit and the Python headers, over 300 MB). bash, coreutils,
# findutils, grep, sed, diffutils, gzip and tar come with minbase anyway;
# they are named so that the list says what is promised.
PACKAGES=(
  bash coreutils findutils grep sed gawk diffutils patch less procps file
  tar gzip zip unzip xxd jq ripgrep
  git curl ca-certificates
  python3 python3-pip python3-venv
  python3-pytest python3-numpy python3-matplotlib python3-pil
  python3-munkres
  nodejs npm
  gcc g++ make libc6-dev
)
# The sandbox user; the server runs every command as this uid:gid.
SANDBOX_UID=1000
# The toolbox manifest: what the image has (name=Debian package, whose
# upstream version is recorded) and the programs a model often reaches for
# that it lacks (each checked with `command -v` in the finished rootfs, so a
# program that arrives with a dependency moves to "has"). The build writes
# the result to /etc/sandbox-mcp/toolbox.json and to the image label
# io.sandbox-mcp.toolbox; the server reads the label at start and puts it in
# its instructions, so what they say is what the image holds.
MANIFEST_HAS=(
  bash=bash git=git curl=curl jq=jq rg=ripgrep patch=patch make=make
  python3=python3 pip=python3-pip pytest=python3-pytest numpy=python3-numpy
  matplotlib=python3-matplotlib PIL=python3-pil
  node=nodejs npm=npm gcc=gcc g++=g++
)
MANIFEST_PROBE=(
  zip unzip xxd file gawk less ps wget sqlite3 cmake tree vim nano ssh
  cargo rustc go java ruby php perl yarn pnpm uv docker sudo
)

die() { echo "build.sh: error: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

hash="$(cat "$here/Dockerfile" "$here/build.sh" | sha256sum | cut -c1-12)"
tag="sandbox-mcp:$hash"

case "${1:-}" in
  --print-tag) echo "$tag"; exit 0 ;;
  "") ;;
  -h|--help) sed -n '2,21p' "$here/build.sh" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
  *) die "unknown argument: $1 (usage: build.sh [--print-tag])" ;;
esac

# The Dockerfile's instructions become `docker import --change` arguments: one
# per instruction, continuation lines joined, comments dropped. Only what
# import can apply is allowed; anything that would run a build step belongs in
# the rootfs steps below (a build step on top of the import would commit a
# layer, which costs minutes on engines without a native overlay diff).
changes=()
while IFS= read -r instr; do
  case "${instr%% *}" in
    ARG|FROM) ;;
    ENV|LABEL|WORKDIR|USER|CMD) changes+=(--change "$instr") ;;
    *) die "image/Dockerfile: \"${instr:0:60}\": only ENV, LABEL, WORKDIR, USER and CMD can be applied to the imported rootfs; do build work in build.sh" ;;
  esac
done < <(awk '
  /^[[:space:]]*#/ { next }
  { part = $0; sub(/^[[:space:]]+/, "", part); line = cont ? line " " part : part }
  /\\[[:space:]]*$/ { sub(/[[:space:]]*\\[[:space:]]*$/, "", line); cont = 1; next }
  { cont = 0; if (line != "") print line }
' "$here/Dockerfile")
changes+=(--change "LABEL io.sandbox-mcp.source-hash=$hash")

command -v docker >/dev/null 2>&1 || die "docker CLI not found"
docker version >/dev/null 2>&1 \
  || die "docker engine unreachable (is dockerd running, and may this user use its socket?)"

if docker image inspect "$tag" >/dev/null 2>&1; then
  log "$tag already exists"
  echo "$tag"
  exit 0
fi

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap and chroot need it); try: sudo $here/build.sh"
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
cleanup() {
  local rc=$?
  set +e
  if [ -n "$workdir" ] && [ -d "$workdir" ]; then
    # debootstrap and the apt step mount /proc (and maybe /sys, /dev) inside
    # the rootfs; if the build died half way they may still be there. Unmount
    # deepest first, then never let rm cross into another filesystem.
    awk -v p="$workdir/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo \
      | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
    rm -rf --one-file-system "$workdir"
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
log "debootstrap $SUITE (minbase) from $MIRROR into $rootfs"
if ! debootstrap --variant=minbase --components=main "$SUITE" "$rootfs" "$MIRROR" >&2; then
  [ -f "$rootfs/debootstrap/debootstrap.log" ] && tail -n 30 "$rootfs/debootstrap/debootstrap.log" >&2
  die "debootstrap failed (is $MIRROR reachable?)"
fi
log "debootstrap done after $((SECONDS - start))s"

# Settings that stay in the image, so that images derived from it with apt-get
# stay lean too: no documentation, manuals or translations, no TypeScript
# declarations in Debian's Node.js modules (node never loads them; they are a
# tenth of the files npm brings), no LTO dump tool (31 MB that building,
# linking and LTO do not use), no Recommends.
mkdir -p "$rootfs/etc/dpkg/dpkg.cfg.d" "$rootfs/etc/apt/apt.conf.d"
cat > "$rootfs/etc/dpkg/dpkg.cfg.d/01-sandbox-mcp-lean" <<'CFG'
# sandbox-mcp: keep the image and images derived from it lean (image/build.sh).
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-exclude=/usr/share/lintian/*
path-exclude=/usr/share/nodejs/*.d.ts
path-exclude=/usr/bin/*lto-dump*
CFG
cat > "$rootfs/etc/apt/apt.conf.d/01-sandbox-mcp" <<'CFG'
// sandbox-mcp: keep derived images lean (image/build.sh).
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
CFG
{
  echo "deb $MIRROR $SUITE main"
  echo "deb $MIRROR $SUITE-updates main"
  [ -z "$SECURITY_MIRROR" ] || echo "deb $SECURITY_MIRROR $SUITE-security main"
} > "$rootfs/etc/apt/sources.list"
# Only for this build: dpkg need not fsync every file of a rootfs that is
# thrown away if the build fails, and nothing may start a service.
echo force-unsafe-io > "$rootfs/etc/dpkg/dpkg.cfg.d/99-sandbox-mcp-build"
printf '#!/bin/sh\nexit 101\n' > "$rootfs/usr/sbin/policy-rc.d"
chmod 0755 "$rootfs/usr/sbin/policy-rc.d"

in_root() {
  chroot "$rootfs" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "$@"
}
log "installing the toolbox: ${PACKAGES[*]}"
mount -t proc proc "$rootfs/proc"
in_root apt-get -q update >&2 \
  || die "apt-get update failed (are $MIRROR${SECURITY_MIRROR:+ and $SECURITY_MIRROR} reachable?)"
in_root apt-get -q -y -o Dpkg::Use-Pty=0 dist-upgrade >&2 || die "apt-get dist-upgrade failed"
in_root apt-get -q -y -o Dpkg::Use-Pty=0 install "${PACKAGES[@]}" >&2 || die "apt-get install failed"
in_root apt-get clean

# The unprivileged user the sandbox runs as. Its home is /tmp, the one
# writable place besides /workspace once the root filesystem is read-only, so
# tools that write to $HOME (git config, pip, npm, ~/.cache) still work.
in_root groupadd --gid "$SANDBOX_UID" sandbox
in_root useradd --uid "$SANDBOX_UID" --gid "$SANDBOX_UID" --home-dir /tmp --no-create-home \
  --shell /bin/bash --comment "sandbox-mcp sandbox user" sandbox
install -d -o "$SANDBOX_UID" -g "$SANDBOX_UID" -m 0755 "$rootfs/workspace"
# An identity for git, so that a first commit works (the sandbox user's
# ~/.gitconfig, in the tmpfs /tmp, still overrides it), and a default branch
# name, which spares every `git init` its hint.
cat > "$rootfs/etc/gitconfig" <<'CFG'
# sandbox-mcp: the sandbox's git identity (image/build.sh).
[user]
	name = sandbox
	email = sandbox@sandbox-mcp.invalid
[init]
	defaultBranch = main
CFG

# The manifest (see MANIFEST_HAS): upstream versions, without epoch and
# Debian revision ("1:2.39.2-1.1" is 2.39.2).
has=() lacks=()
for entry in "${MANIFEST_HAS[@]}"; do
  v="$(in_root dpkg-query -W -f '${Version}' "${entry#*=}")" || die "manifest: package ${entry#*=} is not installed"
  v="${v#*:}"; v="${v%%[-+~]*}"
  has+=("$(printf '{"name":"%s","version":"%s"}' "${entry%%=*}" "$v")")
done
for prog in "${MANIFEST_PROBE[@]}"; do
  if in_root sh -c 'command -v "$1"' sh "$prog" >/dev/null; then
    has+=("$(printf '{"name":"%s"}' "$prog")")
  else
    lacks+=("\"$prog\"")
  fi
done
manifest="$(IFS=,; printf '{"has":[%s],"lacks":[%s]}' "${has[*]}" "${lacks[*]}")"
in_root jq -e . >/dev/null <<<"$manifest" || die "manifest: not JSON: $manifest"
mkdir -p "$rootfs/etc/sandbox-mcp"
printf '%s\n' "$manifest" > "$rootfs/etc/sandbox-mcp/toolbox.json"
# Single quotes keep the JSON's double quotes in the label's value.
changes+=(--change "LABEL io.sandbox-mcp.toolbox='$manifest'")
log "manifest: $manifest"
umount "$rootfs/proc"
rm -f "$rootfs/etc/dpkg/dpkg.cfg.d/99-sandbox-mcp-build" "$rootfs/usr/sbin/policy-rc.d"
log "toolbox installed after $((SECONDS - start))s"

log "trimming the rootfs"
(
  cd "$rootfs"
  # Package caches and indexes: apt-get update fetches them again when an
  # image derived from this one installs more.
  rm -rf var/cache/apt/*.bin var/cache/apt/archives/*.deb var/cache/apt/archives/partial/* \
         var/lib/apt/lists/* var/cache/debconf/*-old var/lib/dpkg/*-old \
         etc/shadow- etc/gshadow- etc/passwd- etc/group-
  # Documentation, manuals, translations that debootstrap installed before the
  # exclusions above existed. Copyright files stay.
  find usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete
  find usr/share/doc -mindepth 1 -type d -empty -delete
  rm -rf usr/share/man/* usr/share/info/* usr/share/locale/* usr/share/lintian \
         usr/share/linda usr/share/bug
  # Logs and the host's identity that debootstrap copied in; docker provides
  # /etc/hosts, /etc/hostname and /etc/resolv.conf at run time.
  rm -rf var/log/* var/cache/ldconfig/aux-cache debootstrap
  : > etc/resolv.conf
  : > etc/hostname
  # No setuid or setgid bit anywhere, on files or directories.
  find . -xdev -perm /6000 \( -type f -o -type d \) -exec chmod ug-s {} +
  left="$(find . -xdev -perm /6000 -print -quit)"
  [ -z "$left" ] || die "a setuid/setgid bit survived: $left"
)

log "importing the rootfs as $tag"
tar -C "$rootfs" --numeric-owner --xattrs -c . \
  | docker import --message "sandbox-mcp toolbox, Debian $SUITE" "${changes[@]}" - "$tag" >&2 \
  || die "docker import failed"

log "built $tag in $((SECONDS - start))s ($(docker image inspect -f '{{.Size}}' "$tag") bytes)"
echo "$tag"
