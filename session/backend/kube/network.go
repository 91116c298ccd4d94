package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// LabelNetwork on a sandbox pod says what network it gets: NetworkNone
// (nothing in or out) or NetworkProxy (out only to its server's proxy).
const (
	LabelNetwork = "io.sandbox-mcp.network"
	NetworkNone  = "none"
	NetworkProxy = "proxy"
)

// IsolationPolicyName is the NetworkPolicy that isolates every sandbox pod
// of the namespace: no ingress, no egress. Policies only add allowances,
// so a sandbox pod gets out only where another policy lets it.
const IsolationPolicyName = "sandbox-mcp-isolate-sandboxes"

// Proxy is where a server's egress proxy is reached from pods.
type Proxy struct {
	// Port is the proxy's TCP port.
	Port int
	// CIDR is the proxy's address range (an IP/32 for a server outside
	// the cluster, e.g. the node's address on the pod network), or "".
	CIDR string
	// PodLabels select the server's own pods (a server running in the
	// cluster), or nil.
	PodLabels map[string]string
}

// IsolationPolicy denies all ingress and egress of every sandbox pod. It is
// pure.
func IsolationPolicy(namespace string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: IsolationPolicyName, Namespace: namespace, Labels: map[string]string{LabelManaged: "1"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelManaged: "1", LabelRole: "sandbox"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
}

// ProxyPolicyName is the NetworkPolicy that lets a server's allowlist
// sandboxes reach its proxy.
func ProxyPolicyName(instance string) string { return "sandbox-mcp-" + instance + "-proxy" }

// ProxyPolicy lets the sandbox pods of one server that are on the
// allowlist network reach its proxy, and nothing else. It is pure.
func ProxyPolicy(namespace, instance string, p Proxy) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(int32(p.Port))
	var peers []networkingv1.NetworkPolicyPeer
	if p.CIDR != "" {
		peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: p.CIDR}})
	}
	if len(p.PodLabels) > 0 {
		peers = append(peers, networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: p.PodLabels}})
	}
	return &networkingv1.NetworkPolicy{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: ProxyPolicyName(instance), Namespace: namespace,
			Labels: map[string]string{LabelManaged: "1", LabelInstance: instance}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{
				LabelManaged: "1", LabelRole: "sandbox", LabelInstance: instance, LabelNetwork: NetworkProxy}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    peers,
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		},
	}
}

// applyPolicy creates np, or replaces the spec of the one there.
func (c *Cluster) applyPolicy(ctx context.Context, np *networkingv1.NetworkPolicy) error {
	nps := c.cs.NetworkingV1().NetworkPolicies(c.cfg.Namespace)
	_, err := nps.Create(ctx, np, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := nps.Get(ctx, np.Name, metav1.GetOptions{})
		if gerr != nil {
			return apiError("read network policy "+np.Name, gerr)
		}
		cur.Spec, cur.Labels = np.Spec, np.Labels
		_, err = nps.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return apiError(fmt.Sprintf("write network policy %s (the server needs create and update on networkpolicies)", np.Name), err)
	}
	return nil
}

// preparePolicies writes the isolation policy and, with a proxy, this
// server's proxy policy.
func (c *Cluster) preparePolicies(ctx context.Context) error {
	if err := c.applyPolicy(ctx, IsolationPolicy(c.cfg.Namespace)); err != nil {
		return err
	}
	if c.cfg.Proxy != nil {
		return c.applyPolicy(ctx, ProxyPolicy(c.cfg.Namespace, c.cfg.Instance, *c.cfg.Proxy))
	}
	return nil
}

// deleteProxyPolicy removes a server's proxy policy.
func (c *Cluster) deleteProxyPolicy(ctx context.Context, instance string) error {
	err := c.cs.NetworkingV1().NetworkPolicies(c.cfg.Namespace).Delete(ctx, ProxyPolicyName(instance), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return apiError("delete network policy "+ProxyPolicyName(instance), err)
	}
	return nil
}
