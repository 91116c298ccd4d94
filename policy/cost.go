package policy

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// The memory a tool call holds while it is in flight, in bytes. Every file,
// list, snapshot and resource call reserves its cost from the server's
// budget (MaxInflightBytes) and its session's (MaxSessionInflightBytes)
// before it starts, sized from the caps it asked for, and gives it back
// once its response is written; so do the arguments of any call from
// ArgumentsThreshold bytes up. A call whose result turns out larger than
// reserved (text that JSON-escapes to more bytes) must grow its
// reservation before it answers, or is refused.
//
// The factors were measured on this server (go-sdk v1.8.0): the peak of
// the Go heap while one call runs, over the bytes of its payload.
const (
	// AgentFrameBytes covers the agent's frames queued for one call while
	// it talks to the sandbox: up to 16 queued, one being routed and one
	// being read, each of at most 1 MiB of payload and 64 KiB of header.
	AgentFrameBytes = 18 * (1<<20 + 64<<10)
	// ResponseFactor is what the server holds per byte of a result's
	// payload JSON while it renders, encodes and writes the response. The
	// MCP SDK encodes a result with encoding/json three times over (the
	// result, the JSON-RPC response, the message, each compacted into a
	// growing buffer and copied out): about 4.5 bytes live per byte of
	// JSON at the peak, plus the result's own strings.
	ResponseFactor = 5
	// ArgumentFactor is what the server holds per byte of a call's JSON
	// arguments from the moment the call is dispatched until it returns:
	// the SDK checks them against the input schema by decoding them into a
	// map and encoding that again, then decodes them into the tool's
	// input; about 6.5 bytes live per byte at the peak.
	ArgumentFactor = 7
	// ArgumentsThreshold is the size from which a call's arguments count
	// against the budgets; smaller ones are not worth the bookkeeping.
	ArgumentsThreshold = 64 << 10
	// ListLineBytes is the most bytes of the agent's list stream taken per
	// entry asked for, on average (an entry's JSON line is about 100 bytes
	// plus its path and link target); a list past it is cut short, as
	// truncated.
	ListLineBytes = 512
	// ListEntryBytes is the Go structures of one listed entry, as received
	// and as rendered, besides its strings.
	ListEntryBytes = 512
)

// ResponseCost is what a result with jsonBytes of payload JSON holds from
// the moment it is rendered until its response is written.
func ResponseCost(jsonBytes int64) int64 { return ResponseFactor * jsonBytes }

// ReadLimit is the most bytes sandbox_read_file returns for a length
// argument (0: to the end of the file, up to the cap).
func (p Policy) ReadLimit(length int64) int64 {
	if length > 0 && length < p.MaxFileBytes {
		return length
	}
	return p.MaxFileBytes
}

// ReadReserve is what a read of up to limit bytes reserves before it starts:
// the agent's frames, the buffer the content arrives in, and a response
// that carries the content twice without escapes (text: the text a model
// reads and the structured field) or once as base64. Once the content is
// known the read resizes to ResponseCost of its exact JSON.
func ReadReserve(limit int64) int64 {
	return AgentFrameBytes + limit + ResponseCost(2*limit)
}

// ArgumentsReserve is what a call's arguments of argBytes bytes of JSON
// reserve when it is dispatched (0 below ArgumentsThreshold).
func ArgumentsReserve(argBytes int64) int64 {
	if argBytes < ArgumentsThreshold {
		return 0
	}
	return ArgumentFactor * argBytes
}

// ListBytes is the most bytes of list stream taken for entries entries.
func ListBytes(entries int) int64 { return int64(entries) * ListLineBytes }

// ListReserve is what sandbox_list reserves for up to entries entries: the
// agent's frames, the stream, the entries' structures, and a response that
// carries each line twice (text and structured) without escapes. Once the
// entries are known the list resizes to their exact cost (ListCost).
func ListReserve(entries int) int64 {
	return AgentFrameBytes + ListBytes(entries) + int64(entries)*ListEntryBytes + ResponseCost(2*ListBytes(entries))
}

// ListCost is what a rendered list of entries entries, whose payload is
// jsonBytes of JSON, holds until its response is written.
func ListCost(entries int, jsonBytes int64) int64 {
	return int64(entries)*ListEntryBytes + ResponseCost(jsonBytes)
}

// StreamReserve is what sandbox_write_file, sandbox_snapshot and
// sandbox_restore reserve besides their arguments: they stream the content
// or the archive to or from the sandbox a chunk at a time, so only the
// agent's frames count.
func StreamReserve() int64 { return AgentFrameBytes }

// ResourceReserve is what reading a snapshot resource whose archive has
// size bytes reserves: the archive read into memory and a response that
// carries it as base64 beside its record.
func ResourceReserve(size int64) int64 {
	return size + ResponseCost(Base64Len(size)+4<<10)
}

// Base64Len is the length of n bytes in standard base64 with padding.
func Base64Len(n int64) int64 { return (n + 2) / 3 * 4 }

// JSONLen is the length of s as a JSON string, quotes included, escaped as
// encoding/json escapes it: <, > and & (HTML-safe), control characters,
// U+2028, U+2029 and each byte of invalid UTF-8 take six bytes; ", \, \b,
// \f, \n, \r and \t take two.
func JSONLen(s string) int64 {
	n := int64(len(s)) + 2
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			n += int64(jsonExtra[b])
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			n += 5
		case r == '\u2028', r == '\u2029':
			n += 3
		}
		i += size
	}
	return n
}

// jsonExtra is the bytes an ASCII byte takes in a JSON string beyond one.
var jsonExtra = func() (t [utf8.RuneSelf]uint8) {
	for b := range t {
		switch b {
		case '"', '\\', '\b', '\f', '\n', '\r', '\t':
			t[b] = 1
		case '<', '>', '&':
			t[b] = 5
		default:
			if b < 0x20 {
				t[b] = 5
			}
		}
	}
	return t
}()

// MaxCallReserve is the most any one call reserves at this policy's caps:
// the largest read, write, list and snapshot resource read.
func (p Policy) MaxCallReserve() int64 {
	// The largest write sends its content as base64; text that escapes to
	// more is refused as too large, and written in parts.
	write := ArgumentsReserve(Base64Len(p.MaxFileBytes)+4<<10) + StreamReserve()
	return max(ReadReserve(p.MaxFileBytes), write, ListReserve(MaxListEntries), ResourceReserve(p.MaxFileBytes))
}

// validateInflight checks that the budgets can hold the costliest call.
func (p Policy) validateInflight() error {
	var errs []error
	if p.MaxInflightBytes <= 0 || p.MaxSessionInflightBytes <= 0 {
		errs = append(errs, errors.New("--max-inflight-bytes and --max-session-inflight-bytes must be positive"))
	} else if p.MaxSessionInflightBytes > p.MaxInflightBytes {
		errs = append(errs, fmt.Errorf("--max-session-inflight-bytes (%d) is above --max-inflight-bytes (%d); one session cannot hold more than the whole server", p.MaxSessionInflightBytes, p.MaxInflightBytes))
	}
	if need := p.MaxCallReserve(); p.MaxFileBytes > 0 && p.MaxSessionInflightBytes > 0 && p.MaxSessionInflightBytes < need {
		errs = append(errs, fmt.Errorf("--max-session-inflight-bytes (%d) is below the %d bytes the largest call at --max-file-bytes (%d) may hold; raise it, or lower --max-file-bytes", p.MaxSessionInflightBytes, need, p.MaxFileBytes))
	}
	return errors.Join(errs...)
}
