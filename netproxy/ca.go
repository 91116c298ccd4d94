package netproxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"sync"
	"time"
)

// Lifetimes of the interception certificates. The CA lives as long as the
// server process (it is made at start and never stored), bounded at a
// year; a leaf is minted per host on first use, cached, and minted again
// when less than leafRenew of its life is left.
const (
	caLifetime   = 365 * 24 * time.Hour
	leafLifetime = 24 * time.Hour
	leafRenew    = time.Hour
	// certBackdate covers clock skew between the host and the sandbox.
	certBackdate = 5 * time.Minute
	// maxLeafCache bounds the cached leaves; interception is for the few
	// hosts named by secrets, so this is never reached in practice.
	maxLeafCache = 256
)

// ca is the interception certificate authority: an ECDSA P-256 key made in
// memory at start, never written anywhere, and a cache of leaf
// certificates it signed.
type ca struct {
	key     *ecdsa.PrivateKey
	cert    *x509.Certificate
	certPEM []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate // by host name
}

// newCA makes a fresh CA. Its subject carries a random serial, so two
// servers' CAs are told apart in a certificate chain.
func newCA(now time.Time) (*ca, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("netproxy: make the interception CA key: %w", err)
	}
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization: []string{"sandbox-mcp"},
			CommonName:   "sandbox-mcp egress proxy CA " + serial.Text(16)[:12],
		},
		NotBefore:             now.Add(-certBackdate),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("netproxy: sign the interception CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("netproxy: parse the interception CA: %w", err)
	}
	return &ca{
		key:     key,
		cert:    cert,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		leaves:  map[string]*tls.Certificate{},
	}, nil
}

func randSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("netproxy: certificate serial: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

// leaf returns a certificate for host signed by the CA, minting it if none
// is cached or the cached one is close to expiry.
func (c *ca) leaf(host string, now time.Time) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.leaves[host]; l != nil && now.Add(leafRenew).Before(l.Leaf.NotAfter) {
		return l, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("netproxy: leaf key for %s: %w", host, err)
	}
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(leafLifetime)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-certBackdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("netproxy: sign a leaf for %s: %w", host, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("netproxy: parse the leaf for %s: %w", host, err)
	}
	l := &tls.Certificate{Certificate: [][]byte{der, c.cert.Raw}, PrivateKey: key, Leaf: cert}
	if len(c.leaves) >= maxLeafCache {
		clear(c.leaves)
	}
	c.leaves[host] = l
	return l, nil
}
