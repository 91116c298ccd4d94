package netproxy

import (
	"encoding/binary"
	"errors"
	"io"
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
