package session

import (
	"context"
	"fmt"

	"github.com/sandbox-mcp/sandbox-mcp/agentclient"
	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// CABundleVars are the variables that point the usual clients at the CA
// bundle the agent writes: OpenSSL and Go (SSL_CERT_FILE), curl, git,
// pip, Python requests, Node.
var CABundleVars = []string{
	"SSL_CERT_FILE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
}

// secretEnv is what a sandbox of template tpl needs when the proxy holds
// secrets it has: each secret's placeholder (never its value), and the
// variables that make programs trust the proxy's CA through the bundle
// setup writes.
func (m *Manager) secretEnv(sandbox string, tpl *Template) []string {
	if !m.holdsSecrets(tpl) {
		return nil
	}
	env := m.proxy.SecretEnv(sandbox)
	for _, v := range CABundleVars {
		env = append(env, v+"="+agentproto.CABundlePath)
	}
	return env
}

// holdsSecrets reports whether a template's sandboxes hold secrets at the
// proxy, and so trust its CA: the default's whenever the proxy has secrets
// (they hold every one), another template's when it names some.
func (m *Manager) holdsSecrets(tpl *Template) bool {
	if m.proxyFor(tpl) == nil || m.proxy.CACert() == nil {
		return false
	}
	return tpl.isDefault || len(tpl.Secrets) > 0
}

// setupSandbox has the agent write the CA bundle, when the proxy holds
// secrets, and take the sandbox's environment, when the backend keeps it
// out of the instance's definition (backend.AgentEnv), before any command
// runs.
func (m *Manager) setupSandbox(ctx context.Context, c *agentclient.Conn, box backend.Instance, tpl *Template) error {
	var req agentproto.SetupRequest
	if m.holdsSecrets(tpl) {
		req.CACerts = string(m.proxy.CACert())
	}
	if ae, ok := box.(backend.AgentEnv); ok {
		req.Env = ae.AgentEnv()
	}
	if req.CACerts == "" && len(req.Env) == 0 {
		return nil
	}
	res, err := c.Setup(ctx, req)
	if err != nil {
		return fmt.Errorf("set up the sandbox (its CA bundle and environment): %w", err)
	}
	if res.Env != len(req.Env) {
		return errcode.Errorf(errcode.Unavailable, "the sandbox's agent took %d of its %d environment variables: it predates setup.env; rebuild the agent image (make k8s-images)", res.Env, len(req.Env))
	}
	if req.CACerts != "" && res.SystemRoots == "" {
		m.log.Warn("the image has no root certificates; the sandbox's CA bundle holds only the proxy's CA, so only hosts with a secret verify", "bundle", res.CABundle)
	}
	return nil
}
