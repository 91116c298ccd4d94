package tools

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
)

// AuditLog appends one JSON object per line to a file: a record per tool
// call (see Record) and whatever else the server decides to audit, such as
// the egress proxy's decisions. It is safe for concurrent use; each record
// is one write of one line, so lines never interleave.
//
// Records hold no secrets by construction: tool arguments appear only as a
// digest, and callers only as an id derived from their token.
type AuditLog struct {
	path string
	log  *slog.Logger

	mu sync.Mutex
	f  *os.File
}

// AuditKindTool is the "kind" of a tool call record in the audit log.
const AuditKindTool = "tool_call"

// OpenAuditLog opens (creating it with mode 0600 if needed) the audit file
// at path for appending. Failures to write later are reported to log (nil
// discards them).
func OpenAuditLog(path string, log *slog.Logger) (*AuditLog, error) {
	if path == "" {
		return nil, errors.New("audit log: no file named")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--audit-log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("--audit-log: %w", err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("--audit-log %s is not a regular file; name a file the server can append to", path)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &AuditLog{path: path, log: log, f: f}, nil
}

// Path returns the file the log appends to.
func (a *AuditLog) Path() string { return a.path }

// Write appends v, marshalled as JSON, and a newline as one line.
func (a *AuditLog) Write(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("audit log: encode record: %w", err)
	}
	b = append(b, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return errors.New("audit log: closed")
	}
	if _, err := a.f.Write(b); err != nil {
		return fmt.Errorf("audit log %s: %w", a.path, err)
	}
	return nil
}

// Record appends a tool call record, tagged "kind": "tool_call". It fits
// Deps.Audit; a failed write is logged, and the call goes on.
func (a *AuditLog) Record(r Record) {
	line := struct {
		Kind string `json:"kind"`
		Record
	}{AuditKindTool, r}
	if err := a.Write(line); err != nil {
		a.log.Error("audit log write failed", "err", err)
	}
}

// Close closes the file; later writes fail.
func (a *AuditLog) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return nil
	}
	err := a.f.Close()
	a.f = nil
	return err
}

// AuditKindProxy tags the record of a proxy decision.
const AuditKindProxy = "proxy_decision"

// ProxyRecord is the audit record of one egress proxy decision.
type ProxyRecord struct {
	Kind       string    `json:"kind"`
	Time       time.Time `json:"time"`
	Sandbox    string    `json:"sandbox"`
	Host       string    `json:"host"`
	Normalized string    `json:"normalized,omitempty"`
	Port       int       `json:"port"`
	Resolved   []string  `json:"resolved,omitempty"`
	Addr       string    `json:"addr,omitempty"`
	Decision   string    `json:"decision"` // allow or deny
	Reason     string    `json:"reason"`
	Rule       string    `json:"rule,omitempty"`
	Status     int       `json:"status"`
	Duration   float64   `json:"duration_ms"`
}

// Proxy appends the record of a proxy decision: the sandbox, the host and
// port asked for, the addresses it resolved to, the one dialled, and why.
// A failed write is logged.
func (a *AuditLog) Proxy(d netproxy.Decision) {
	r := ProxyRecord{
		Kind: AuditKindProxy, Time: time.Now().UTC(), Sandbox: d.Sandbox, Host: d.Host, Normalized: d.Normalized,
		Port: d.Port, Decision: "deny", Reason: d.Reason, Rule: d.Rule, Status: d.Status,
		Duration: float64(d.Duration.Microseconds()) / 1000,
	}
	if d.Allow {
		r.Decision = "allow"
	}
	for _, ip := range d.Resolved {
		r.Resolved = append(r.Resolved, ip.String())
	}
	if d.Addr.IsValid() {
		r.Addr = d.Addr.String()
	}
	if err := a.Write(r); err != nil {
		a.log.Error("audit log write failed", "err", err)
	}
}
