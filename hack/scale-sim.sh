#!/usr/bin/env bash
# The scale simulation of the Kubernetes backend's control path: a private
# control plane (etcd, kube-apiserver, kube-scheduler; no kubelet) with
# kwok's fake nodes, and the session/backend/kube code creating, watching, refilling
# and sweeping sandbox pods on them. Nothing runs in the pods: the point is
# the API traffic and the time the control path takes, not the node.
#
#   hack/scale-sim.sh            NODES=1000 SANDBOXES=10000 by default
#   NODES=100 SANDBOXES=1000 hack/scale-sim.sh    a quicker run
#
# Results: a table on stdout and JSON in $SCALE_OUT (default
# docs/scale/last-run.json). Everything it starts is stopped and its
# directory ($SCALE_DIR, default /var/tmp/sandbox-mcp-scale) removed at the
# end, whatever happens. It is separate from the test node: its own ports
# (API 26443, etcd 23890/23891), its own data, so tests on the node are not
# slowed by ten thousand pods, and no real pod can land on a fake node.
#
# Needs: the Kubernetes binaries that ../shared/tools/k8s/k8s-node.sh builds
# (K8S_BIN, default /var/tmp/k8s-node/bin: etcd, kube-apiserver,
# kube-scheduler), openssl, and kwok (KWOK, default: built into $SCALE_DIR's
# parent with `go install sigs.k8s.io/kwok/cmd/kwok@v0.7.0` if missing).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
root="$(cd "$here/.." && pwd -P)"
W="${SCALE_DIR:-/var/tmp/sandbox-mcp-scale}"
K8S_BIN="${K8S_BIN:-/var/tmp/k8s-node/bin}"
KWOK_VERSION=v0.7.0
KWOK_BIN_DIR="${KWOK_BIN_DIR:-/var/tmp/sandbox-mcp-tools/bin}"
KWOK="${KWOK:-$KWOK_BIN_DIR/kwok}"
NODES="${NODES:-1000}"
SANDBOXES="${SANDBOXES:-10000}"
OUT="${SCALE_OUT:-$root/docs/scale/last-run.json}"
API_PORT=26443 ETCD_PORT=23890 ETCD_PEER=23891

say() { echo "scale-sim: [$(date +%T)] $*" >&2; }
die() { echo "scale-sim: error: $*" >&2; exit 1; }

for b in etcd kube-apiserver kube-scheduler; do
  [ -x "$K8S_BIN/$b" ] || die "$K8S_BIN/$b is missing: build it with ../shared/tools/k8s/k8s-node.sh deps build (or set K8S_BIN)"
done
command -v openssl >/dev/null || die "openssl is missing: apt-get install openssl"
if [ ! -x "$KWOK" ]; then
  say "building kwok $KWOK_VERSION into $KWOK_BIN_DIR (a few minutes, once)"
  mkdir -p "$KWOK_BIN_DIR"
  GOBIN="$KWOK_BIN_DIR" go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" || die "go install kwok failed"
  KWOK="$KWOK_BIN_DIR/kwok"
fi

pids=()
cleanup() {
  local rc=$? p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$p" 2>/dev/null || true
  done
  if [ "$rc" -ne 0 ] && [ -d "$W/logs" ]; then
    say "failed (exit $rc); the last lines of each log:"
    for f in "$W"/logs/*.log; do echo "== $f" >&2; tail -5 "$f" >&2; done
  fi
  rm -rf "$W"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[ -e "$W" ] && die "$W exists: another simulation runs, or one was killed; remove it when none runs"
mkdir -p "$W/pki" "$W/logs"
start() { # name cmd...
  local n=$1; shift
  "$@" >>"$W/logs/$n.log" 2>&1 &
  pids+=("$!")
  say "started $n (pid $!)"
}
waitfor() { # seconds what cmd...
  local s=$1 d=$2 t0=$SECONDS; shift 2
  until "$@" >/dev/null 2>&1; do
    (( SECONDS - t0 > s )) && die "timed out waiting for $d"
    sleep 1
  done
}

# PKI: a CA, the API server's certificate, an admin client, the service
# account key pair.
(
  cd "$W/pki"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -subj /CN=scale-sim-ca -days 2 -out ca.crt 2>/dev/null
  sign() { # name subject ext
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
    printf '%s\n' "$3" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  }
  sign apiserver /CN=kube-apiserver "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth"
  sign admin "/O=system:masters/CN=scale-admin" "extendedKeyUsage=clientAuth"
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
)
KC="$W/pki/admin.kubeconfig"
cat >"$KC" <<KCEOF
apiVersion: v1
kind: Config
clusters:
- name: scale
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: $W/pki/ca.crt}
users:
- name: admin
  user: {client-certificate: $W/pki/admin.crt, client-key: $W/pki/admin.key}
contexts:
- name: scale
  context: {cluster: scale, user: admin}
current-context: scale
KCEOF

start etcd "$K8S_BIN/etcd" --name scale --data-dir "$W/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster "scale=http://127.0.0.1:$ETCD_PEER" --quota-backend-bytes=4294967296
waitfor 30 "etcd" curl -sf "http://127.0.0.1:$ETCD_PORT/health"
# No controller manager runs, so nothing would lift the not-ready taint that
# TaintNodesByCondition puts on a new node: that admission plugin is off.
start apiserver "$K8S_BIN/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --secure-port=$API_PORT --advertise-address=127.0.0.1 \
  --tls-cert-file="$W/pki/apiserver.crt" --tls-private-key-file="$W/pki/apiserver.key" \
  --client-ca-file="$W/pki/ca.crt" \
  --service-account-key-file="$W/pki/sa.pub" --service-account-signing-key-file="$W/pki/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=10.96.0.0/16 --authorization-mode=RBAC --profiling=false \
  --disable-admission-plugins=TaintNodesByCondition
waitfor 120 "kube-apiserver" curl -sf --cacert "$W/pki/ca.crt" --cert "$W/pki/admin.crt" --key "$W/pki/admin.key" "https://127.0.0.1:$API_PORT/readyz"
# The scheduler's client limits are raised as a large cluster's are (the
# defaults, 50 requests/s, would measure the scheduler's limit, not ours).
cat >"$W/scheduler.yaml" <<SCEOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: $KC, qps: 500, burst: 1000}
leaderElection: {leaderElect: false}
SCEOF
start scheduler "$K8S_BIN/kube-scheduler" --config="$W/scheduler.yaml" --secure-port=0
# kwok plays the kubelet of every node annotated kwok.x-k8s.io/node=fake:
# heartbeats, pod IPs, pod phases, deletions.
start kwok "$KWOK" --kubeconfig="$KC" \
  --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --cidr=10.0.0.1/8 --node-ip=10.255.255.254 --node-lease-duration-seconds=40 --v=WARN
say "control plane and kwok up; running the simulation ($NODES nodes, $SANDBOXES sandboxes)"

mkdir -p "$(dirname "$OUT")"
cd "$root"
SANDBOX_MCP_SCALE_KUBECONFIG="$KC" SANDBOX_MCP_SCALE_NODES="$NODES" SANDBOX_MCP_SCALE_SANDBOXES="$SANDBOXES" \
SANDBOX_MCP_SCALE_OUT="$OUT" SANDBOX_MCP_SCALE_APISERVER_METRICS=1 \
  go test -count=1 -timeout 90m -run '^TestScaleSim$' -v ./session/backend/kube/ 2>&1 | grep -v '^=== \(RUN\|PAUSE\|CONT\)' >&2
say "results in $OUT"
cat "$OUT"
