package netproxy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
)

// Sandboxes whose addresses are not stable (pods on a cluster) are told
// apart by a credential instead: each sandbox gets a random token (Grant),
// its clients send it in the proxy URL (HTTP_PROXY=http://sbx:TOKEN@host:port,
// which clients turn into "Proxy-Authorization: Basic ..."), and one shared
// listener (ServeShared) serves every sandbox, each request under the limits
// of the sandbox its credential names. A Serve for one sandbox that was
// granted a token checks it too, beside the client's address.

// CredentialUser is the user name in a sandbox's proxy URL.
const CredentialUser = "sbx"

// NewToken returns a random token for Grant (32 hex digits).
func NewToken() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b[:])
}

// ProxyURL is the proxy URL a sandbox is given: http://sbx:TOKEN@hostport.
func ProxyURL(hostport, token string) string {
	u := url.URL{Scheme: "http", Host: hostport, User: url.UserPassword(CredentialUser, token)}
	return u.String()
}

// tokenKey is what the proxy keeps of a token: its hash, so that a map
// lookup's timing tells nothing of the tokens held.
func tokenKey(token string) [32]byte { return sha256.Sum256([]byte(token)) }

// Grant lets requests that carry token (see ProxyURL) through as sandbox's,
// under its limits, until revoke is called. Sandbox ids and tokens are one
// to one: granting a token again replaces the old grant's sandbox.
func (p *Proxy) Grant(sandbox, token string) (revoke func()) {
	sb := p.register(sandbox, nil)
	k := tokenKey(token)
	p.mu.Lock()
	if p.tokens == nil {
		p.tokens = map[[32]byte]*sandboxState{}
	}
	p.tokens[k] = sb
	sb.token = k
	sb.hasToken = true
	p.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			if p.tokens[k] == sb {
				delete(p.tokens, k)
			}
			p.mu.Unlock()
			if p.unregister(sandbox, nil) {
				p.flushRefusals(sb)
			}
		})
	}
}

// credential extracts the token from a Proxy-Authorization header ("" if
// there is none or it is not Basic sbx:TOKEN).
func credential(h map[string][]string) string {
	v := http.Header(h).Get("Proxy-Authorization")
	scheme, enc, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return ""
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return ""
	}
	user, token, ok := strings.Cut(string(raw), ":")
	if !ok || user != CredentialUser {
		return ""
	}
	return token
}

// byCredential returns the sandbox a request's credential names, or nil.
func (p *Proxy) byCredential(h map[string][]string) *sandboxState {
	tok := credential(h)
	if tok == "" {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tokens[tokenKey(tok)]
}

// credentialOK reports whether a request to a sandbox's own listener
// carries its token (always true for a sandbox granted none).
func (p *Proxy) credentialOK(sb *sandboxState, h map[string][]string) bool {
	p.mu.Lock()
	want, has := sb.token, sb.hasToken
	p.mu.Unlock()
	if !has {
		return true
	}
	got := tokenKey(credential(h))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// errNoCredential is the 407 sent for a missing or unknown credential.
var errNoCredential = &refusal{http.StatusProxyAuthRequired,
	"this proxy needs the sandbox's credential: use the proxy URL from HTTP_PROXY/HTTPS_PROXY as it is (http://sbx:TOKEN@host:port)"}

// ServeShared accepts connections on l for every sandbox granted a token,
// until ctx ends or l is closed, like Serve; each request is served as the
// sandbox its credential names, and one without a known credential gets
// 407. Before its credential is known a connection is charged to its
// source address: at most Config.MaxPendingPerAddr connections per address
// (and Config.MaxPending in all) are in that phase at once, and each has
// Config.AuthTimeout to send its request header; so connections that one
// pod leaves idle delay no other pod's requests.
func (p *Proxy) ServeShared(ctx context.Context, l net.Listener) error {
	p.mu.Lock()
	if p.anon == nil {
		p.anon = newSandboxState("(no credential)", p.cfg.Rate, p.cfg.Burst)
	}
	anon := p.anon
	p.mu.Unlock()
	return p.serve(ctx, l, &served{sb: anon, shared: true})
}
