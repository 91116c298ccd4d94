// Package audit is the audit log: one JSON line per tool call and per
// egress proxy decision, appended to a file the operator names, with tool
// arguments kept only as a keyed digest. It sits beside the packages whose
// events it records (tools, netproxy) and is wired to them in main.
package audit

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
)

// Log appends one JSON object per line to a file: a record per tool
// call (see ToolRecord) and whatever else the server decides to audit, such as
// the egress proxy's decisions. It is safe for concurrent use; each record
// is one write of one line, so lines never interleave.
//
// Records hold no secrets by construction: tool arguments appear only as a
// keyed digest (see Digest), and callers only as an id derived from their
// token.
type Log struct {
	path string
	key  []byte
	log  *slog.Logger

	// now and pid are time.Now and os.Getpid but in tests.
	now func() time.Time
	pid int

	mu sync.Mutex
	f  *os.File
}

// KindTool is the "kind" of a tool call record in the audit log.
const KindTool = "tool_call"

// Open opens (creating it with mode 0600 if needed) the audit file
// at path for appending. key keys the digests of tool arguments (see
// LoadKey). Failures to write later are reported to log (nil discards
// them).
func Open(path string, key []byte, log *slog.Logger) (*Log, error) {
	if path == "" {
		return nil, errors.New("audit log: no file named")
	}
	if len(key) != KeyBytes {
		return nil, fmt.Errorf("audit log: the digest key has %d bytes, want %d", len(key), KeyBytes)
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
	return &Log{path: path, key: key, log: log, now: time.Now, pid: os.Getpid(), f: f}, nil
}

// Path returns the file the log appends to.
func (a *Log) Path() string { return a.path }

// Write appends v, marshalled as JSON, and a newline as one line.
func (a *Log) Write(v any) error {
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

// ToolRecord is the audit record of one tool call. Its JSON form is the
// line --audit-log holds (see testdata/lines.golden): the audit log owns
// it, and main fills it from what the tools report.
type ToolRecord struct {
	Kind      string    `json:"kind"` // KindTool; Record sets it
	Time      time.Time `json:"time"`
	Caller    string    `json:"caller,omitempty"`
	Session   string    `json:"session,omitempty"`
	Sandbox   string    `json:"sandbox,omitempty"`
	Tool      string    `json:"tool"`
	ArgDigest string    `json:"arg_digest"`
	// Args are the call's arguments as received; only their keyed digest
	// (Log.Digest) is written, as arg_digest.
	Args     json.RawMessage `json:"-"`
	Decision string          `json:"decision"` // allow or deny
	Reason   string          `json:"reason,omitempty"`
	ExitCode *int            `json:"exit_code,omitempty"`
	Bytes    int64           `json:"bytes"`
	Duration float64         `json:"duration_ms"`
}

// Record appends a tool call record, tagged "kind": "tool_call", with the
// digest of r.Args as its arg_digest unless r has one. A failed write is
// logged, and the call goes on.
func (a *Log) Record(r ToolRecord) {
	r.Kind = KindTool
	if r.ArgDigest == "" {
		r.ArgDigest = a.Digest(r.Args)
	}
	if err := a.Write(r); err != nil {
		a.log.Error("audit log write failed", "err", err)
	}
}

// Close closes the file; later writes fail.
func (a *Log) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return nil
	}
	err := a.f.Close()
	a.f = nil
	return err
}

// KindProxy tags the record of a proxy decision.
const KindProxy = "proxy_decision"

// ProxyRecord is the audit record of an egress proxy decision: one per
// allowed request, and for refusals the aggregates the proxy makes (the
// first of each kind per interval, then a summary with the count of its
// repeats; see netproxy.Config.RefusalInterval).
type ProxyRecord struct {
	Kind       string    `json:"kind"`
	Time       time.Time `json:"time"`
	Sandbox    string    `json:"sandbox"`
	Client     string    `json:"client,omitempty"`
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
	Count      int       `json:"count"`             // requests this record stands for
	Summary    bool      `json:"summary,omitempty"` // sums up an interval's repeated refusals
}

// Proxy appends the record of a proxy decision: the sandbox, the host and
// port asked for, the addresses it resolved to, the one dialled, why, and
// how many requests the record stands for. A failed write is logged.
func (a *Log) Proxy(d netproxy.Decision) {
	r := ProxyRecord{
		Kind: KindProxy, Time: a.now().UTC(), Sandbox: d.Sandbox, Host: d.Host, Normalized: d.Normalized,
		Port: d.Port, Decision: "deny", Reason: d.Reason, Rule: d.Rule, Status: d.Status,
		Duration: float64(d.Duration.Microseconds()) / 1000, Count: d.Count, Summary: d.Summary,
	}
	if d.Client.IsValid() {
		r.Client = d.Client.String()
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

// KindSecret tags the record of a secret put into a request.
const KindSecret = "secret_use"

// SecretRecord is the audit record of a secret the egress proxy put into a
// request: which secret, for which host, from which sandbox; one per
// secret per intercepted tunnel. It never holds the value.
type SecretRecord struct {
	Kind    string    `json:"kind"`
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox"`
	Secret  string    `json:"secret"`
	Host    string    `json:"host"`
	Port    int       `json:"port"`
	Event   string    `json:"event"` // "secret NAME used for HOST"
}

// SecretUse appends the record of a secret's use. A failed write is logged.
func (a *Log) SecretUse(u netproxy.SecretUse) {
	r := SecretRecord{Kind: KindSecret, Time: a.now().UTC(), Sandbox: u.Sandbox, Secret: u.Name, Host: u.Host, Port: u.Port,
		Event: "secret " + u.Name + " used for " + u.Host}
	if err := a.Write(r); err != nil {
		a.log.Error("audit log write failed", "err", err)
	}
}

// KeyFile is the file in the state directory that holds the key of
// the audit log's argument digests.
const KeyFile = "audit.key"

// KeyBytes is the size of the digest key.
const KeyBytes = 32

// digestBytes is how much of the HMAC a digest shows: 128 bits.
const digestBytes = 16

// Digest is the audit log's digest of a tool call's arguments:
// "hmac-sha256:" and the first 16 bytes, in hex, of HMAC-SHA256 keyed with
// this server's key over the arguments JSON with the whitespace outside
// strings removed. Without the key a reader of the log cannot test a
// guess of what the arguments were; with it an operator can check a call
// (sandbox-mcp audit digest). Digests stay comparable across restarts as
// long as the key file is kept.
func (a *Log) Digest(args []byte) string { return Digest(a.key, args) }

// Digest is Digest with an explicit key.
func Digest(key, args []byte) string {
	mac := hmac.New(sha256.New, key)
	writeCompact(mac, args)
	return "hmac-sha256:" + hex.EncodeToString(mac.Sum(nil)[:digestBytes])
}

// writeCompact writes JSON text to h without the whitespace between
// tokens, so that the same arguments sent with other spacing (or typed by
// an operator checking a digest) digest the same. It reads the input once
// and allocates nothing: arguments can be megabytes.
func writeCompact(h hash.Hash, js []byte) {
	inString, escaped := false, false
	start := 0
	for i, c := range js {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			h.Write(js[start:i])
			start = i + 1
		}
	}
	h.Write(js[start:])
}

// LoadKey returns the digest key kept in dir/audit.key, making it on
// first use: 32 random bytes in a file of mode 0600, written whole before it
// appears under its name, so a server starting beside another never reads
// half a key. dir is created (0700) if missing.
func LoadKey(dir string) ([]byte, error) {
	key, err := ReadKey(dir)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	key = make([]byte, KeyBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".audit.key-*")
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(key)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	// CreateTemp makes the file 0600. Link fails if another server made
	// the key first: then that key is the one.
	if err := os.Link(tmp.Name(), filepath.Join(dir, KeyFile)); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return ReadKey(dir)
		}
		return nil, fmt.Errorf("audit key: %w", err)
	}
	return key, nil
}

// ReadKey reads the digest key in dir/audit.key without making one.
// It refuses a key file that others than its owner can read.
func ReadKey(dir string) ([]byte, error) {
	path := filepath.Join(dir, KeyFile)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("audit key %s is not a regular file; remove it, and the server makes a new key (digests made with the old one will no longer match)", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("audit key %s has mode %v: anyone who can read it can test guesses against the audit log's digests; run chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	key, err := io.ReadAll(io.LimitReader(f, KeyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	if len(key) != KeyBytes {
		return nil, fmt.Errorf("audit key %s does not hold %d bytes; remove it, and the server makes a new key (digests made with the old one will no longer match)", path, KeyBytes)
	}
	return key, nil
}

// KindServer tags the record of the server starting or stopping.
const KindServer = "server"

// ServerRecord is the audit record of the server starting or stopping, with
// why it stopped: the audit file is the one record left when the server's
// stderr is gone.
type ServerRecord struct {
	Kind   string    `json:"kind"`
	Time   time.Time `json:"time"`
	Event  string    `json:"event"` // start or stop
	Reason string    `json:"reason,omitempty"`
	PID    int       `json:"pid"`
}

// Server appends the record of the server starting or stopping; a failed
// write is logged.
func (a *Log) Server(event, reason string) {
	if err := a.Write(ServerRecord{Kind: KindServer, Time: a.now().UTC(), Event: event, Reason: reason, PID: a.pid}); err != nil {
		a.log.Error("audit log write failed", "err", err)
	}
}

// KindApproval tags the record of a question put to a person about a host
// the egress proxy refused a sandbox (--network-approval), or its answer.
const KindApproval = "network_approval"

// ApprovalRecord is the audit record of one approval question or its
// answer: which sandbox, which host and port, the operator's pattern that
// let the question be asked, and what the person answered (approved,
// denied, declined, cancelled, timeout or failed).
type ApprovalRecord struct {
	Kind    string    `json:"kind"`
	Time    time.Time `json:"time"`
	Event   string    `json:"event"` // question or answer
	Caller  string    `json:"caller,omitempty"`
	Session string    `json:"session,omitempty"`
	Sandbox string    `json:"sandbox"`
	Tool    string    `json:"tool"`
	Host    string    `json:"host"`
	Port    int       `json:"port"`
	Pattern string    `json:"pattern"`
	Answer  string    `json:"answer,omitempty"`
	Detail  string    `json:"detail,omitempty"` // the question's text, or what went wrong
}

// Approval appends an approval question or answer; a failed write is
// logged.
func (a *Log) Approval(r ApprovalRecord) {
	r.Kind = KindApproval
	if err := a.Write(r); err != nil {
		a.log.Error("audit log write failed", "err", err)
	}
}
