package netproxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// ErrorHeader is the response header that carries the reason of every
// refusal; the body carries the same sentence.
const ErrorHeader = "X-Sandbox-Proxy-Error"

// maxLoggedHost bounds the requested host kept in a Decision and in logs.
const maxLoggedHost = 256

// Decision records how the proxy answered a request. One is logged (and
// passed to Config.OnDecision) for every allowed request. Refusals are
// aggregated per sandbox (see Config.RefusalInterval): the first of each
// kind in an interval is recorded as it happens, and a summary with the
// count of its repeats when the interval ends.
type Decision struct {
	Sandbox    string     // the id given to Serve
	Client     netip.Addr // the address the request came from (unmapped, no zone); zero in an aggregate of several kinds
	Host       string     // the host as requested (for a malformed request, the raw target), at most 256 bytes
	Normalized string     // the normalised host name; "" if the target was not a valid name
	Port       int        // the requested port; 0 if it could not be parsed
	Allow      bool       // true if a tunnel was established
	Reason     string     // why: the refusal sentence sent to the client, or "allowed by <rule>"
	Rule       string     // the matching allowlist entry; "" if none matched
	// Unlisted marks a refusal of a host that is on none of the sandbox's
	// lists (base or approved) and that it did not drop: the refusal that
	// approving the host (Proxy.Approve) would lift.
	Unlisted bool
	Resolved []netip.Addr // every address the resolver returned, as returned but with zones stripped; nil if no lookup was made
	Addr     netip.Addr   // the address dialled, or the first one refused (unmapped, no zone); zero if none
	Status   int          // the HTTP status sent: 200, 400, 403, 405, 408, 429, 431, 502, 503 or 504
	// Duration runs from the end of the request header to the response: the
	// time the proxy spent deciding, resolving and connecting. It is zero
	// for requests refused while their header was read, and in summaries.
	Duration time.Duration
	// Count is how many requests the record stands for: 1 for a request
	// recorded as it was answered; in a summary, the refusals of this kind
	// after the first one in the interval.
	Count int
	// Summary marks the record that sums up an interval's repeated
	// refusals of one kind (its fields are those of the first) or, with an
	// empty Host, the refusals of kinds past Config.MaxRefusalKinds.
	Summary bool
}

// Close records one tunnel's end. Exactly one Close is logged (and passed to
// Config.OnClose) for every allowed Decision.
type Close struct {
	Sandbox   string
	Host      string // the normalised host name
	Port      int
	Addr      netip.Addr // the upstream address
	BytesUp   int64      // bytes copied from the client to the upstream
	BytesDown int64      // bytes copied from the upstream to the client
	Duration  time.Duration
	// Reason is why the tunnel ended: "eof" (both sides finished), "idle"
	// (no bytes either way for IdleTimeout), "lifetime" (MaxLifetime
	// reached), "ctx" (Serve's context ended) or "error" (a read or write
	// failed, e.g. a reset).
	Reason string
}

// Close reasons.
const (
	CloseEOF      = "eof"
	CloseIdle     = "idle"
	CloseLifetime = "lifetime"
	CloseCtx      = "ctx"
	CloseError    = "error"
)

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

func (p *Proxy) logDecision(d *Decision) {
	level := slog.LevelInfo
	if !d.Allow {
		level = slog.LevelWarn
	}
	if p.log.Enabled(context.Background(), level) {
		resolved := make([]string, len(d.Resolved))
		for i, a := range d.Resolved {
			resolved[i] = a.String()
		}
		p.log.LogAttrs(context.Background(), level, "proxy decision",
			slog.String("sandbox", d.Sandbox),
			slog.String("client", addrString(d.Client)),
			slog.String("host", d.Host),
			slog.String("normalized", d.Normalized),
			slog.Int("port", d.Port),
			slog.Any("resolved", resolved),
			slog.String("addr", addrString(d.Addr)),
			slog.Bool("allow", d.Allow),
			slog.String("reason", d.Reason),
			slog.String("rule", d.Rule),
			slog.Int("status", d.Status),
			slog.Duration("duration", d.Duration),
			slog.Int("count", d.Count),
			slog.Bool("summary", d.Summary),
		)
	}
	if p.cfg.OnDecision != nil {
		p.cfg.OnDecision(*d)
	}
}

// recordRefusal logs a refusal if it is the first of its kind in the
// sandbox's current interval, and otherwise only counts it.
func (p *Proxy) recordRefusal(sb *sandboxState, d *Decision) {
	if d.Host != "" { // a request was read: it is the sandbox's own
		sb.recent.add(d, time.Now())
	}
	if sb.refusals.note(d, p.cfg.MaxRefusalKinds, p.cfg.RefusalInterval, func() { p.flushRefusals(sb) }) {
		d.Count = 1
		p.logDecision(d)
	}
}

// flushRefusals ends a sandbox's refusal interval and logs its summaries.
func (p *Proxy) flushRefusals(sb *sandboxState) {
	for _, d := range sb.refusals.take(sb.id, p.cfg.MaxRefusalKinds) {
		p.logDecision(&d)
	}
}

func (p *Proxy) logClose(c *Close) {
	p.log.LogAttrs(context.Background(), slog.LevelInfo, "proxy tunnel closed",
		slog.String("sandbox", c.Sandbox),
		slog.String("host", c.Host),
		slog.Int("port", c.Port),
		slog.String("addr", addrString(c.Addr)),
		slog.Int64("bytes_up", c.BytesUp),
		slog.Int64("bytes_down", c.BytesDown),
		slog.Duration("duration", c.Duration),
		slog.String("reason", c.Reason),
	)
	if p.cfg.OnClose != nil {
		p.cfg.OnClose(*c)
	}
}

// writeRefusal sends a complete error response: the reason as a text/plain
// body and in the ErrorHeader header, and "Connection: close".
func writeRefusal(w io.Writer, status int, reason string, extra ...string) error {
	reason = headerSafe(reason)
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", status, http.StatusText(status))
	b.WriteString("Content-Type: text/plain; charset=utf-8\r\n")
	b.WriteString(ErrorHeader + ": " + reason + "\r\n")
	for i := 0; i+1 < len(extra); i += 2 {
		b.WriteString(extra[i] + ": " + extra[i+1] + "\r\n")
	}
	b.WriteString("Content-Length: " + strconv.Itoa(len(reason)+1) + "\r\n")
	b.WriteString("Connection: close\r\n\r\n")
	b.WriteString(reason + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// headerSafe replaces every byte that is not printable ASCII. Reasons quote
// untrusted input with quote(), so this is a second line of defence against
// header injection.
func headerSafe(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] < 0x20 || b[j] > 0x7e {
					b[j] = '?'
				}
			}
			return string(b)
		}
	}
	return s
}
