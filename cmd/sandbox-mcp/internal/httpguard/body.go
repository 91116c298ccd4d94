package httpguard

// Request bodies count against the server's in-flight memory budget before
// they are read. The MCP SDK reads a POST's whole body into memory, then
// decodes it, before any tool or quota sees the call; without this, a
// caller holding many slow bodies open made the server hold them all.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

const (
	// bodyFactor is what the server holds per byte of a POST body until
	// the request is served: the SDK reads it with io.ReadAll into a
	// buffer that grows by copying (up to about 2.25 bytes live per byte
	// while it grows, 1.25 once read) and decodes the JSON-RPC message
	// from it (the params copied once more). The arguments of a tool call
	// are counted again by the call itself once it is dispatched.
	bodyFactor = 3
	// chunkedFactor is the same for a body sent without Content-Length:
	// the guard reads it first, in bodyChunk pieces, and the SDK then
	// reads it again from those.
	chunkedFactor = bodyFactor + 1
	// bodyChunk is the step by which a body of unknown length is admitted.
	bodyChunk = 64 << 10
	// bodyWait is how long a body waits for room before it is refused,
	// as long as a tool call waits for memory.
	bodyWait = 2 * time.Second
	// bodyRetryAfter is what a body refused for room is told to wait.
	bodyRetryAfter = 5 * time.Second
)

// admitBody admits the body of a POST of caller into the memory budget
// before any of it is read: a body with a Content-Length all at once, one
// without in bodyChunk steps as it arrives. It returns the request to
// serve and the function that gives the body's bytes back, to call once
// the request is served; or it has answered the request (413 past the body
// cap, 429 when the caller's share is short, 503 when the server's total
// is) and returns false.
func (g *Guard) admitBody(w http.ResponseWriter, r *http.Request, caller string) (*http.Request, func(), bool) {
	if g.reserve == nil || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return r, func() {}, true
	}
	if r.ContentLength > g.maxBody {
		g.tooLarge(w, r)
		return nil, nil, false
	}
	if r.ContentLength > 0 {
		hold, err := g.reserve(r.Context(), caller, bodyFactor*r.ContentLength, bodyWait)
		if err != nil {
			g.refuseBody(w, r, err)
			return nil, nil, false
		}
		return r, hold.Release, true
	}
	// No Content-Length (chunked): read it here, a chunk at a time, each
	// admitted before it is read; the SDK reads it again from memory.
	hold, err := g.reserve(r.Context(), caller, chunkedFactor*bodyChunk, bodyWait)
	if err != nil {
		g.refuseBody(w, r, err)
		return nil, nil, false
	}
	var chunks [][]byte
	var n int64
	for {
		chunk := make([]byte, bodyChunk)
		k, err := io.ReadFull(r.Body, chunk)
		n += int64(k)
		chunks = append(chunks, chunk[:k])
		if n > g.maxBody {
			hold.Release()
			g.tooLarge(w, r)
			return nil, nil, false
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			hold.Release()
			http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
			return nil, nil, false
		}
		if err := hold.Resize(chunkedFactor * (n + bodyChunk)); err != nil {
			hold.Release()
			g.refuseBody(w, r, err)
			return nil, nil, false
		}
	}
	readers := make([]io.Reader, len(chunks))
	for i, c := range chunks {
		readers[i] = bytes.NewReader(c)
	}
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(io.MultiReader(readers...))
	r2.ContentLength = n
	return r2, hold.Release, true
}

// tooLarge refuses a body past the cap without reading it.
func (g *Guard) tooLarge(w http.ResponseWriter, r *http.Request) {
	g.refuse(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf(
		"TOO_LARGE: this server takes request bodies of at most %d bytes (a --max-file-bytes file as base64 and its envelope); write a large file in parts with append", g.maxBody))
}

// refuseBody answers a body the memory budget has no room for: 503 when
// the server's total is short, 429 when the caller's share is, with
// Retry-After.
func (g *Guard) refuseBody(w http.ResponseWriter, r *http.Request, err error) {
	var scope interface{ ServerWide() bool }
	if !errors.As(err, &scope) {
		// The request's context ended while it waited: its client is
		// gone, and nothing reads an answer.
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	status, what := http.StatusTooManyRequests, "your requests and calls in flight"
	if scope.ServerWide() {
		status, what = http.StatusServiceUnavailable, "this server's requests and calls in flight"
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(bodyRetryAfter.Seconds())))
	g.refuse(w, r, status, fmt.Sprintf("BUSY: no room for this request's body in the memory %s may hold (a body counts %d times its size, before it is read): %v; retry in %s",
		what, bodyFactor, err, bodyRetryAfter))
}
