// Package kube runs sandboxes as pods on a Kubernetes cluster: one pod per
// sandbox, hardened to the Pod Security "restricted" profile, with the
// agent delivered by an init container so that any image the cluster can run
// serves as the sandbox image.
//
// # The pod
//
// Pod builds the pod from Params and is pure: the hardening lives there, in
// one place, and is tested field by field. The pod has two containers:
//
//   - "agent", an init container from the agent image (FROM scratch and the
//     static sandbox-agent), runs `sandbox-agent install` to copy the agent
//     onto an emptyDir the sandbox container mounts read-only at AgentDir;
//   - "sandbox", the user's image, runs `sandbox-agent hold` as its pid 1:
//     it only reaps orphans and waits.
//
// The server then runs the agent itself with `pods/exec` into the sandbox
// container and speaks the agent protocol over the exec's stdin and stdout.
// An exec stream, unlike a container's own stdout (which `pods/attach`
// reads), is never written to the node's container log, so the protocol
// (file contents, command output) does not land on the node's disk. When
// the agent's stream ends it stops the hold process, and with it the pod.
//
// Under "restricted" a container can add no capability, so the agent runs
// as the sandbox user itself (sandbox-agent -unprivileged): commands run as
// the agent's own user and the kill-tree finds a command's processes by the
// process tree. The pod, not the agent's identity, is the boundary; see
// docs/kubernetes.md for what differs from the Docker backend.
//
// # The cluster
//
// Cluster creates pods, watches them until the agent answers, maps start
// failures (unschedulable, image missing, quota, a deadline) to UNAVAILABLE
// with the reason, removes them, and sweeps what servers that are gone left:
// each server renews a Lease (coordination.k8s.io) while it runs, and a pod
// whose server's lease has expired is deleted.
package kube
