package netproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// maxHelloBytes bounds what the proxy reads of a tunnel's first flight
// while looking for the TLS ClientHello: the largest handshake message a
// ClientHello may take (post-quantum key shares make them a few KiB) and
// its record headers.
const maxHelloBytes = 64 << 10

// clientHello is what the proxy learns from the first bytes of a tunnel.
type clientHello struct {
	raw []byte // every byte read, to be replayed to the upstream
	tls bool   // the bytes start a TLS handshake record
	sni string // the server_name (host_name) extension, "" if none
}

var errBadHello = errors.New("malformed TLS ClientHello")

// checkHello reads the start of a tunnel and refuses it if the client
// opens with a TLS ClientHello whose server name is not host. It reads the
// client (early first, then c) and, at the same time, the upstream, until
// one of them sends a first byte:
//
//   - the upstream speaks first (no TLS server does): the tunnel passes
//     unchecked, unless the client has begun a TLS record, which is closed;
//   - the client's first byte does not start a TLS handshake record: the
//     tunnel passes unchecked;
//   - it does: the whole ClientHello must follow within HeaderTimeout of
//     that byte. It is checked in full (a hello without a server name
//     passes); a hello that is malformed, cut short by the client, or not
//     complete in time closes the tunnel. A partial hello never passes.
//
// The wait for the first byte is bounded by the tunnel's idle time and
// lifetime, counted from start; ended is then the close reason (as it is
// when ctx ends). Otherwise it returns the bytes read from each side, to be
// replayed to the other.
func (p *Proxy) checkHello(ctx context.Context, c, up net.Conn, early []byte, host string, start time.Time) (toUp, toClient []byte, tlsHello bool, ref *refusal, ended string) {
	type upRead struct {
		b   []byte
		err error
	}
	fromUp := make(chan upRead, 1)
	go func() {
		b := make([]byte, readBufSize)
		n, err := up.Read(b)
		fromUp <- upRead{b[:n], err}
	}()

	// The client's read deadline: first the idle time (or the end of the
	// lifetime), then HeaderTimeout from the first byte. Once the read is
	// interrupted (the upstream spoke, ctx ended), no later deadline
	// undoes that.
	var dmu sync.Mutex
	interrupted := false
	setDeadline := func(t time.Time, interrupt bool) {
		dmu.Lock()
		defer dmu.Unlock()
		if !interrupted {
			interrupted = interrupt
			c.SetReadDeadline(t)
		}
	}
	lifeEnd := start.Add(p.cfg.MaxLifetime)
	setDeadline(start.Add(min(p.cfg.IdleTimeout, p.cfg.MaxLifetime)), false)
	type helloRead struct {
		h   clientHello
		err error
	}
	fromClient := make(chan helloRead, 1)
	go func() {
		r := &firstByteReader{r: io.MultiReader(bytes.NewReader(early), c), first: func() {
			setDeadline(time.Now().Add(p.cfg.HeaderTimeout), false)
		}}
		h, err := readClientHello(r)
		fromClient <- helloRead{h, err}
	}()
	stop := context.AfterFunc(ctx, func() { setDeadline(time.Now(), true) })

	var hr helloRead
	var ur upRead
	upSpoke, gotUp := false, false
	select {
	case hr = <-fromClient:
	case ur = <-fromUp:
		gotUp = true
		if upSpoke = len(ur.b) > 0; upSpoke {
			setDeadline(time.Now(), true) // not TLS: end the client's read, keep what it got
		}
		// An upstream that ends without a byte says nothing about the
		// client, whose hello is still checked; the tunnel passes its EOF
		// on later (a read after EOF returns EOF again).
		hr = <-fromClient
	}
	if !upSpoke {
		up.SetReadDeadline(time.Now()) // end the upstream read, keep what it got
		if !gotUp {
			ur = <-fromUp
		}
	}
	stop()
	c.SetReadDeadline(time.Time{})
	up.SetReadDeadline(time.Time{})
	toUp = hr.h.raw
	if len(toUp) < len(early) {
		toUp = append(toUp, early[len(toUp):]...)
	}
	toClient = ur.b
	quiet := len(hr.h.raw) == 0 // the client sent no byte
	switch {
	case hr.err == nil && !hr.h.tls:
		return toUp, toClient, false, nil, "" // not TLS
	case hr.err == nil:
		// A whole ClientHello, checked below.
	case errors.Is(hr.err, errBadHello):
		return toUp, toClient, true, &refusal{http.StatusForbidden, fmt.Sprintf(
			"the tunnel to %s began with a malformed TLS ClientHello; send a standard TLS handshake", quote(host))}, ""
	case ctx.Err() != nil:
		return toUp, toClient, hr.h.tls, nil, CloseCtx
	case quiet && (upSpoke || errors.Is(hr.err, io.EOF)):
		// The upstream spoke first, or the client half-closed without a
		// byte: nothing of the client's is left to check.
		return toUp, toClient, false, nil, ""
	case quiet && isTimeout(hr.err):
		if !time.Now().Before(lifeEnd) {
			return toUp, toClient, false, nil, CloseLifetime
		}
		return toUp, toClient, false, nil, CloseIdle
	case quiet:
		return toUp, toClient, false, nil, CloseError
	case upSpoke:
		return toUp, toClient, true, &refusal{http.StatusForbidden, fmt.Sprintf(
			"the upstream %s spoke while the client's TLS ClientHello was still arriving; a tunnel that begins like TLS passes only once its whole ClientHello is checked", quote(host))}, ""
	case isTimeout(hr.err):
		return toUp, toClient, true, &refusal{http.StatusRequestTimeout, fmt.Sprintf(
			"the TLS ClientHello to %s did not arrive whole within %v of its first byte; the proxy checks the whole ClientHello before it passes a byte on, so send it at once", quote(host), p.cfg.HeaderTimeout)}, ""
	default:
		return toUp, toClient, true, &refusal{http.StatusBadRequest, fmt.Sprintf(
			"the TLS ClientHello to %s ended before it was whole; a tunnel that begins like TLS passes only once its whole ClientHello is checked", quote(host))}, ""
	}
	if hr.h.sni == "" {
		return toUp, toClient, true, nil, "" // no server name: an accepted limit
	}
	if sni := strings.TrimSuffix(asciiLower(hr.h.sni), "."); sni != host {
		return toUp, toClient, true, &refusal{http.StatusForbidden, fmt.Sprintf(
			"the TLS ClientHello names %s, not %s, the host this tunnel was allowed for; connect to the host you name",
			quote(truncate(sni, maxLoggedHost)), quote(host))}, ""
	}
	return toUp, toClient, true, nil, ""
}

// firstByteReader calls first once, after the first read that returns a
// byte.
type firstByteReader struct {
	r     io.Reader
	first func()
	seen  bool
}

func (f *firstByteReader) Read(b []byte) (int, error) {
	n, err := f.r.Read(b)
	if n > 0 && !f.seen {
		f.seen = true
		f.first()
	}
	return n, err
}

// readClientHello reads the first TLS records from r until it holds the
// whole ClientHello, and extracts the SNI. If the first byte is not a TLS
// handshake record, it returns at once with tls false (the tunnel carries
// something else). A read error is returned with what was read so far.
func readClientHello(r io.Reader) (clientHello, error) {
	var h clientHello
	var msg []byte // handshake bytes, across records
	need := -1     // length of the handshake message with its 4-byte header, once known
	for need < 0 || len(msg) < need {
		var hdr [5]byte
		if err := h.read(r, hdr[:1]); err != nil {
			return h, err
		}
		if hdr[0] != 0x16 { // handshake
			if len(h.raw) == 1 {
				return h, nil // not TLS
			}
			return h, errBadHello // a ClientHello interrupted by another record type
		}
		h.tls = true
		if err := h.read(r, hdr[1:]); err != nil {
			return h, err
		}
		n := int(binary.BigEndian.Uint16(hdr[3:]))
		if hdr[1] != 3 || n == 0 || n > 1<<14+256 || len(h.raw)+n > maxHelloBytes {
			return h, errBadHello
		}
		body := make([]byte, n)
		if err := h.read(r, body); err != nil {
			return h, err
		}
		msg = append(msg, body...)
		if need < 0 && len(msg) >= 4 {
			if msg[0] != 1 { // client_hello
				return h, errBadHello
			}
			need = 4 + (int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]))
			if need > maxHelloBytes {
				return h, errBadHello
			}
		}
	}
	sni, ok := parseSNI(msg[4:need])
	if !ok {
		return h, errBadHello
	}
	h.sni = sni
	return h, nil
}

// read reads exactly len(b) bytes into b and keeps them in h.raw.
func (h *clientHello) read(r io.Reader, b []byte) error {
	n, err := io.ReadFull(r, b)
	h.raw = append(h.raw, b[:n]...)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.EOF
	}
	return err
}

// parseSNI finds the host_name of the server_name extension in a
// ClientHello body (RFC 8446 4.1.2, RFC 6066 3). ok is false if the body is
// malformed; a hello without the extension gives "", true.
func parseSNI(b []byte) (sni string, ok bool) {
	s := cursor(b)
	if !s.skip(2+32) || !s.skipVec(1) || !s.skipVec(2) || !s.skipVec(1) { // version, random, session id, suites, compression
		return "", false
	}
	if len(s) == 0 {
		return "", true // no extensions
	}
	exts, ok := s.vec(2)
	if !ok {
		return "", false
	}
	for len(exts) > 0 {
		typ, ok1 := exts.u16()
		data, ok2 := exts.vec(2)
		if !ok1 || !ok2 {
			return "", false
		}
		if typ != 0 { // server_name
			continue
		}
		list, ok := data.vec(2)
		if !ok {
			return "", false
		}
		for len(list) > 0 {
			if len(list) < 1 {
				return "", false
			}
			nameType := list[0]
			list = list[1:]
			name, ok := list.vec(2)
			if !ok {
				return "", false
			}
			if nameType == 0 { // host_name
				return string(name), true
			}
		}
		return "", true
	}
	return "", true
}

// cursor reads a TLS message.
type cursor []byte

func (c *cursor) skip(n int) bool {
	if len(*c) < n {
		return false
	}
	*c = (*c)[n:]
	return true
}

func (c *cursor) u16() (uint16, bool) {
	if len(*c) < 2 {
		return 0, false
	}
	v := binary.BigEndian.Uint16(*c)
	*c = (*c)[2:]
	return v, true
}

// vec reads a vector with a lenBytes-byte length prefix (1 or 2).
func (c *cursor) vec(lenBytes int) (cursor, bool) {
	if len(*c) < lenBytes {
		return nil, false
	}
	n := int((*c)[0])
	if lenBytes == 2 {
		n = int(binary.BigEndian.Uint16(*c))
	}
	*c = (*c)[lenBytes:]
	if len(*c) < n {
		return nil, false
	}
	v := (*c)[:n]
	*c = (*c)[n:]
	return v, true
}

func (c *cursor) skipVec(lenBytes int) bool {
	_, ok := c.vec(lenBytes)
	return ok
}
