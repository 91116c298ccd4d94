package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
)

// TestErrorsKeepTheirCause: the UNAVAILABLE errors made from a cluster's
// or the network's error keep that error visible to errors.Is and
// errors.As, so a caller can tell a quota from a missing namespace.
func TestErrorsKeepTheirCause(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	quota := apierrors.NewForbidden(pods, "p", errors.New("exceeded quota: q"))
	forbidden := apierrors.NewForbidden(pods, "p", errors.New("violates PodSecurity"))
	missing := apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "ns")
	for _, tc := range []struct {
		name string
		err  error
		is   func(error) bool
	}{
		{"quota", startError("p", quota), apierrors.IsForbidden},
		{"forbidden", startError("p", forbidden), apierrors.IsForbidden},
		{"not found", startError("p", missing), apierrors.IsNotFound},
		{"deadline", apiError("list pods", fmt.Errorf("get: %w", context.DeadlineExceeded)),
			func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }},
	} {
		if e, ok := errcode.As(tc.err); !ok || e.Code != errcode.Unavailable {
			t.Errorf("%s: %v is not UNAVAILABLE", tc.name, tc.err)
		}
		if !tc.is(tc.err) {
			t.Errorf("%s: %v lost its cause", tc.name, tc.err)
		}
	}

	// The proxy's listener: an address already taken.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b := &Backend{cfg: BackendConfig{ProxyListen: ln.Addr().String(), ProxyAdvertise: "10.0.0.1:3128"},
		served: map[*netproxy.Proxy]bool{}}
	err = b.serveProxy(&netproxy.Proxy{})
	var op *net.OpError
	if !errors.As(err, &op) {
		t.Errorf("serveProxy on a taken address: %v does not carry the *net.OpError", err)
	}
}
