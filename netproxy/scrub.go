package netproxy

import (
	"encoding/base64"
	"io"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"
)

// Scrubbing: what an intercepted host sends back to the sandbox has each of
// the tunnel's secret values, in any common encoding, turned back into the
// sandbox's placeholder, so that an upstream that quotes a request (an echo
// service, an error page, a redirect) never hands the value over.
//
// A value is recognised as the bytes it is made of once the escapes of the
// text around it are undone, one escape at a time, in any mix: percent
// escapes (%2f and %2F), '+' for a space, JSON and JavaScript escapes
// (\u002f, \/, \x2f, surrogate pairs), and HTML character references
// (&#47;, &#x2F;, &amp;). Its base64 forms (standard and URL alphabets, at
// each of the three alignments a value can have inside longer data, so the
// value inside "Basic base64(user:value)" too) are recognised by the
// characters that only the value decides, plus the characters it shares
// with its neighbours; their characters may be percent- or JSON-escaped as
// well. A match is replaced by the placeholder, whose characters need no
// escape in any of these texts.

// maxUnitBytes is the longest escape of one character: "&#1114111;". A
// form of e elements is at most e*maxUnitBytes bytes long.
const maxUnitBytes = 10

// byteClass is a set of bytes.
type byteClass [4]uint64

func (c *byteClass) add(b byte)      { c[b>>6] |= 1 << (b & 63) }
func (c *byteClass) has(b byte) bool { return c[b>>6]&(1<<(b&63)) != 0 }

// form is one encoding of a secret's value as the sequence of bytes it is
// made of once escapes are undone: an optional lead element (any byte of a
// class), the exact bytes of body, an optional trail element.
type form struct {
	lead, trail *byteClass
	body        string
}

func (f *form) elems() int {
	n := len(f.body)
	if f.lead != nil {
		n++
	}
	if f.trail != nil {
		n++
	}
	return n
}

// beginsWith reports whether a match of the form can begin with the bytes
// c, d: c read as it is, or c beginning an escape that d can continue.
func (f *form) beginsWith(c, d byte) bool {
	follows := func() bool { return f.elems() == 1 || isEscapeStart(d) || f.accepts(1, d) }
	switch {
	case f.accepts(0, c) && follows():
		return true
	case c == '%':
		return isHexDigit(d)
	case c == '\\':
		return strings.IndexByte(`ux/"\'bfnrt`, d) >= 0
	case c == '&':
		return strings.IndexByte("#algq", d) >= 0
	case c == '+':
		return f.accepts(0, ' ') && follows()
	}
	return false
}

// accepts reports whether element j of the form may be b.
func (f *form) accepts(j int, b byte) bool {
	if f.lead != nil {
		if j == 0 {
			return f.lead.has(b)
		}
		j--
	}
	if j < len(f.body) {
		return f.body[j] == b
	}
	return f.trail.has(b)
}

const (
	stdAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	urlAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
)

// valueForms returns the forms of value: the value itself and its base64
// forms in both alphabets at each alignment (a value that starts a, where a
// is the offset of its first byte in a 3-byte group).
func valueForms(value string) []form {
	forms := []form{{body: value}}
	seen := map[string]bool{}
	for _, alphabet := range []string{stdAlphabet, urlAlphabet} {
		for a := range 3 {
			f := base64Form(value, a, alphabet)
			key := f.body + "\x00" + classKey(f.lead) + classKey(f.trail)
			if !seen[key] {
				seen[key] = true
				forms = append(forms, f)
			}
		}
	}
	return forms
}

func classKey(c *byteClass) string {
	if c == nil {
		return "-"
	}
	var b strings.Builder
	for i := range 256 {
		if c.has(byte(i)) {
			b.WriteByte(byte(i))
		}
	}
	return b.String()
}

// base64Form is value's base64 form when its first byte is at offset a of
// a 3-byte group: the characters whose six bits all come from the value
// (body), and the characters at either end that take some bits from the
// value and some from its neighbours (lead, trail: every character whose
// bits from the value agree).
func base64Form(value string, a int, alphabet string) form {
	start, end := 8*a, 8*(a+len(value)) // the value's bits, counted from the group's start
	bit := func(i int) int {            // bit i of the value, i in [start, end)
		b := value[(i-start)/8]
		return int(b>>(7-(i-start)%8)) & 1
	}
	var f form
	var body []byte
	for k := start / 6; 6*k < end; k++ {
		lo, hi := 6*k, 6*k+6
		switch {
		case lo >= start && hi <= end:
			v := 0
			for i := lo; i < hi; i++ {
				v = v<<1 | bit(i)
			}
			body = append(body, alphabet[v])
		case lo < start: // the value's first bits are this character's last
			c := new(byteClass)
			for ch := range 64 {
				ok := true
				for i := start; i < hi; i++ {
					ok = ok && (ch>>(hi-1-i))&1 == bit(i)
				}
				if ok {
					c.add(alphabet[ch])
				}
			}
			f.lead = c
		default: // the value's last bits are this character's first
			c := new(byteClass)
			for ch := range 64 {
				ok := true
				for i := lo; i < end; i++ {
					ok = ok && (ch>>(hi-1-i))&1 == bit(i)
				}
				if ok {
					c.add(alphabet[ch])
				}
			}
			f.trail = c
		}
	}
	f.body = string(body)
	return f
}

// scrubIndex is what finding some values takes: their forms and tables of
// the bytes a match can begin with. It is made once for a host's secrets
// and shared by the host's tunnels, each with its sandbox's placeholders.
type scrubIndex struct {
	values []string
	forms  []scrubForm
	first  [256][]int           // for each byte, the forms (indexes into forms) whose first element it can be
	pairs  [1 << 16 / 64]uint64 // the pairs of bytes (b[p]<<8 | b[p+1]) a match can begin with
	start  [256]bool            // the bytes a match can begin with
	maxLen int                  // the longest a match can be, in bytes
}

// scrubForm is one form of one value.
type scrubForm struct {
	f      *form
	elems  int
	target int // the value's index
}

// newScrubIndex indexes values, whose forms are forms[i].
func newScrubIndex(values []string, forms [][]form) *scrubIndex {
	x := &scrubIndex{values: values}
	for ti := range values {
		for i := range forms[ti] {
			f := &forms[ti][i]
			fi := len(x.forms)
			x.forms = append(x.forms, scrubForm{f: f, elems: f.elems(), target: ti})
			for c := range 256 {
				if f.accepts(0, byte(c)) {
					x.first[c] = append(x.first[c], fi)
				}
				if isEscapeStart(byte(c)) {
					x.start[c] = true // an escape cut short by the end of the data
				}
				for d := range 256 {
					if f.beginsWith(byte(c), byte(d)) {
						x.start[c] = true
						k := c<<8 | d
						x.pairs[k>>6] |= 1 << (k & 63)
					}
				}
			}
			x.maxLen = max(x.maxLen, f.elems()*maxUnitBytes)
		}
	}
	return x
}

// scrubber turns a tunnel's secret values back into their placeholders.
type scrubber struct {
	*scrubIndex
	placeholders []string // for each value
}

type matchState int

const (
	noMatch matchState = iota
	matched
	needMore // b ends before a match could be decided
)

// matcher runs one form against b from one position. Where an escape
// decodes to the very character it starts with (a value holding '%' met by
// "%25"), both readings are tried; failed is their memory, so that a value
// full of such characters costs no more than one pass per reading.
type matcher struct {
	f      *form
	b      []byte
	final  bool // b holds everything that will come
	n      int  // the form's elements
	more   bool // some reading ran past the end of b
	failed map[[2]int]bool
	dec    [4]byte
}

// run matches elements j... of the form at b[p:] and returns the end of
// the match.
func (m *matcher) run(p, j int) (int, matchState) {
	for j < m.n {
		if p >= len(m.b) {
			m.more = m.more || !m.final
			return 0, noMatch
		}
		c := m.b[p]
		k, d, short := 0, m.dec[:0], false
		if isEscapeStart(c) {
			k, d, short = decodeEscape(m.b[p:], m.final, m.dec[:0])
		}
		if short {
			// Maybe an escape: wait for the rest rather than read it
			// literally, so that a match does not depend on where the
			// stream was cut.
			m.more = true
			return 0, noMatch
		}
		decOK := k > 0 && j+len(d) <= m.n
		for i := 0; decOK && i < len(d); i++ {
			decOK = m.f.accepts(j+i, d[i])
		}
		litOK := m.f.accepts(j, c)
		switch {
		case decOK && litOK:
			key := [2]int{p + k, j + len(d)}
			if !m.failed[key] {
				if end, st := m.run(key[0], key[1]); st == matched {
					return end, st
				}
				if m.failed == nil {
					m.failed = map[[2]int]bool{}
				}
				m.failed[key] = true
			}
			p, j = p+1, j+1
		case decOK:
			p, j = p+k, j+len(d)
		case litOK:
			p, j = p+1, j+1
		default:
			return 0, noMatch
		}
	}
	return p, matched
}

// matchAt tries every form at b[p:] and returns the end of the first match
// and its placeholder. needMore means no form matched, but one might once
// more bytes come.
func (s *scrubber) matchAt(b []byte, p int, final bool) (end int, placeholder string, st matchState) {
	st = noMatch
	// The forms to try: those that can begin with b[p] as it is, and, if
	// it begins an escape, those that can begin with what it decodes to.
	candidates := s.first[b[p]]
	if c := b[p]; isEscapeStart(c) {
		var buf [4]byte
		k, d, short := decodeEscape(b[p:], final, buf[:0])
		switch {
		case short:
			return 0, "", needMore
		case k > 0 && len(candidates) == 0:
			candidates = s.first[d[0]]
		case k > 0:
			candidates = append(slices.Clip(candidates), s.first[d[0]]...)
		}
	}
	var m matcher
	for _, fi := range candidates {
		sf := &s.forms[fi]
		m = matcher{f: sf.f, n: sf.elems, b: b, final: final}
		if e, r := m.run(p, 0); r == matched {
			return e, s.placeholders[sf.target], matched
		}
		if m.more {
			st = needMore
		}
	}
	return 0, "", st
}

// scrub appends b to out with every match replaced. Unless final, it stops
// at the first place where a match might begin but b ends too soon to tell,
// and returns the rest of b, to be scrubbed again with what comes next; the
// rest is shorter than maxLen.
func (s *scrubber) scrub(out, b []byte, final bool) (_, rest []byte) {
	emitted := 0
	for p := 0; p < len(b); {
		if p = s.skip(b, p); p == len(b) {
			break
		}
		end, ph, st := s.matchAt(b, p, final)
		switch st {
		case matched:
			out = append(out, b[emitted:p]...)
			out = append(out, ph...)
			p, emitted = end, end
		case needMore:
			return append(out, b[emitted:p]...), b[p:]
		default:
			p++
		}
	}
	return append(out, b[emitted:]...), nil
}

// skip returns the first position from p on where a match can begin, or
// len(b).
func (x *scrubIndex) skip(b []byte, p int) int {
	pairs := &x.pairs
	hit := func(k uint16) bool { return pairs[k>>6]&(1<<(k&63)) != 0 }
	for ; p+4 < len(b); p += 4 { // four pairs at a time, most of which begin nothing
		w := b[p : p+5]
		k0, k1 := uint16(w[0])<<8|uint16(w[1]), uint16(w[1])<<8|uint16(w[2])
		k2, k3 := uint16(w[2])<<8|uint16(w[3]), uint16(w[3])<<8|uint16(w[4])
		if hit(k0) || hit(k1) || hit(k2) || hit(k3) {
			break
		}
	}
	for ; p+1 < len(b); p++ {
		if k := uint16(b[p])<<8 | uint16(b[p+1]); pairs[k>>6]&(1<<(k&63)) != 0 {
			return p
		}
	}
	if p < len(b) && !x.start[b[p]] {
		p++
	}
	return p
}

// scrubString is scrub for a whole text.
func (s *scrubber) scrubString(v string) string {
	if len(s.values) == 0 {
		return v
	}
	out, _ := s.scrub(nil, []byte(v), true)
	return string(out)
}

// scrubHeaderValue scrubs a header value. A run of base64 that decodes to
// text holding a value (a "Basic" credential, a token in a redirect's
// query) is decoded, scrubbed and encoded again the same way, so the
// sandbox gets what it sent; whatever is left goes through scrubString.
func (s *scrubber) scrubHeaderValue(v string) string {
	if len(s.values) == 0 {
		return v
	}
	var b strings.Builder
	for i := 0; i < len(v); {
		j := i
		for j < len(v) && isBase64Char(v[j]) {
			j++
		}
		for k := 0; j > i && k < 2 && j < len(v) && v[j] == '='; k++ {
			j++ // padding ends a run
		}
		if j == i {
			b.WriteByte(v[i])
			i++
			continue
		}
		b.WriteString(s.rebase64(v[i:j]))
		i = j
	}
	return s.scrubString(b.String())
}

// isEscapeStart reports whether c may begin an escape that decodeEscape
// reads.
func isEscapeStart(c byte) bool { return c == '%' || c == '\\' || c == '&' || c == '+' }

func isBase64Char(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '-' || c == '_'
}

// rebase64 returns run with a value in its decoded text replaced, encoded
// again with the encoding it decodes with, or run unchanged.
func (s *scrubber) rebase64(run string) string {
	if len(run) < 8 {
		return run
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		raw, err := enc.DecodeString(run)
		if err != nil {
			continue
		}
		if clean := s.scrubString(string(raw)); clean != string(raw) {
			return enc.EncodeToString([]byte(clean))
		}
		return run
	}
	return run
}

// scrubHeader scrubs every value of h in place. A field whose name holds a
// value (names are compared without case: net/http changes their case) is
// removed.
func (s *scrubber) scrubHeader(h http.Header) {
	if len(s.values) == 0 {
		return
	}
	for k, vs := range h {
		if s.nameHolds(k) {
			delete(h, k)
			continue
		}
		for i, v := range vs {
			vs[i] = s.scrubHeaderValue(v)
		}
	}
}

func (s *scrubber) nameHolds(k string) bool {
	if s.scrubString(k) != k {
		return true
	}
	lk := strings.ToLower(k)
	for _, v := range s.values {
		if strings.Contains(lk, strings.ToLower(v)) {
			return true
		}
	}
	return false
}

// scrubReader scrubs a body as it is read. It holds back only the bytes
// that might begin a match that is not whole yet (fewer than maxLen), so a
// streamed response is passed on as it comes.
type scrubReader struct {
	s       *scrubber
	src     io.Reader
	pending []byte // read, not decided yet
	out     []byte // decided; out[off:] is not returned yet
	off     int
	buf     []byte
	err     error // src's error, once it has one
	onEOF   func()
}

func newScrubReader(s *scrubber, src io.Reader, onEOF func()) *scrubReader {
	return &scrubReader{s: s, src: src, buf: make([]byte, 32<<10), onEOF: onEOF}
}

func (r *scrubReader) Read(p []byte) (int, error) {
	for r.off == len(r.out) {
		r.off = 0
		if r.err != nil {
			if len(r.pending) > 0 {
				r.out, _ = r.s.scrub(r.out[:0], r.pending, true)
				r.pending = r.pending[:0]
				continue
			}
			r.out = r.out[:0]
			return 0, r.err
		}
		n, err := r.src.Read(r.buf)
		if err != nil {
			r.err = err
			if err == io.EOF && r.onEOF != nil {
				r.onEOF()
			}
		}
		in := r.buf[:n]
		if len(r.pending) > 0 {
			in = append(r.pending, in...)
		}
		var rest []byte
		r.out, rest = r.s.scrub(r.out[:0], in, false)
		r.pending = append(r.pending[:0], rest...)
	}
	n := copy(p, r.out[r.off:])
	r.off += n
	return n, nil
}

// decodeEscape decodes the escape at the start of b (which starts with
// '%', '\\', '&' or '+') into d. k is the bytes it takes, 0 if b does not
// start with an escape; short says that b ends too soon to tell (never when
// final).
func decodeEscape(b []byte, final bool, d []byte) (k int, _ []byte, short bool) {
	need := func(n int) bool { return len(b) < n && !final }
	switch b[0] {
	case '+':
		return 1, append(d, ' '), false
	case '%':
		if len(b) < 3 {
			return 0, d, need(3) && allHex(b[1:])
		}
		if v, ok := hexVal(b[1:3]); ok {
			return 3, append(d, byte(v)), false
		}
	case '\\':
		if len(b) < 2 {
			return 0, d, need(2)
		}
		switch b[1] {
		case 'u':
			if len(b) < 6 {
				return 0, d, need(6) && allHex(b[2:])
			}
			u, ok := hexVal(b[2:6])
			if !ok {
				return 0, d, false
			}
			switch {
			case 0xD800 <= u && u < 0xDC00: // a high surrogate, whose low half follows
				if len(b) < 12 {
					return 0, d, need(12) && prefixOf(b[6:], `\u`) && allHex(b[min(8, len(b)):])
				}
				lo, ok := hexVal(b[8:12])
				if b[6] != '\\' || b[7] != 'u' || !ok || lo < 0xDC00 || lo > 0xDFFF {
					return 0, d, false
				}
				return 12, utf8.AppendRune(d, rune(0x10000+(u-0xD800)<<10+(lo-0xDC00))), false
			case 0xDC00 <= u && u < 0xE000:
				return 0, d, false
			}
			return 6, utf8.AppendRune(d, rune(u)), false
		case 'x':
			if len(b) < 4 {
				return 0, d, need(4) && allHex(b[2:])
			}
			if v, ok := hexVal(b[2:4]); ok {
				return 4, append(d, byte(v)), false
			}
		case '/', '"', '\\', '\'':
			return 2, append(d, b[1]), false
		case 'b':
			return 2, append(d, '\b'), false
		case 'f':
			return 2, append(d, '\f'), false
		case 'n':
			return 2, append(d, '\n'), false
		case 'r':
			return 2, append(d, '\r'), false
		case 't':
			return 2, append(d, '\t'), false
		}
	case '&':
		return decodeEntity(b, final, d)
	}
	return 0, d, false
}

var namedEntities = map[string]byte{"amp": '&', "lt": '<', "gt": '>', "quot": '"', "apos": '\''}

// decodeEntity decodes an HTML character reference: &#DDD; (up to 7
// digits), &#xHHH; (up to 6) or one of the named ones for &<>"'.
func decodeEntity(b []byte, final bool, d []byte) (int, []byte, bool) {
	semi := -1
	for i := 1; i < len(b) && i < maxUnitBytes; i++ {
		if b[i] == ';' {
			semi = i
			break
		}
	}
	if semi < 0 {
		// Too short to tell, if what there is could still become one.
		return 0, d, !final && len(b) < maxUnitBytes && entityPrefix(b[1:])
	}
	body := string(b[1:semi])
	if c, ok := namedEntities[body]; ok {
		return semi + 1, append(d, c), false
	}
	if len(body) < 2 || body[0] != '#' {
		return 0, d, false
	}
	var r rune
	switch {
	case body[1] == 'x' || body[1] == 'X':
		v, ok := hexVal([]byte(body[2:]))
		if !ok || len(body) < 3 || len(body) > 8 {
			return 0, d, false
		}
		r = rune(v)
	default:
		if len(body) > 8 {
			return 0, d, false
		}
		for _, c := range body[1:] {
			if c < '0' || c > '9' {
				return 0, d, false
			}
			r = r*10 + c - '0'
		}
	}
	if r > utf8.MaxRune || 0xD800 <= r && r < 0xE000 {
		return 0, d, false
	}
	return semi + 1, utf8.AppendRune(d, r), false
}

// entityPrefix reports whether b (after the '&') could begin a character
// reference.
func entityPrefix(b []byte) bool {
	if len(b) > 0 && b[0] == '#' {
		rest := b[1:]
		if len(rest) > 0 && (rest[0] == 'x' || rest[0] == 'X') {
			return allHex(rest[1:])
		}
		for _, c := range rest {
			if c < '0' || c > '9' {
				return false
			}
		}
		return true
	}
	for name := range namedEntities {
		if strings.HasPrefix(name, string(b)) {
			return true
		}
	}
	return false
}

func prefixOf(b []byte, s string) bool {
	return len(b) <= len(s) && string(b) == s[:len(b)] || len(b) > len(s) && string(b[:len(s)]) == s
}

func isHexDigit(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func allHex(b []byte) bool {
	_, ok := hexVal(b)
	return ok || len(b) == 0
}

// hexVal parses b (at most 8 digits) as hexadecimal, either case.
func hexVal(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 8 {
		return 0, false
	}
	v := 0
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			v = v<<4 | int(c-'0')
		case 'a' <= c && c <= 'f':
			v = v<<4 | int(c-'a'+10)
		case 'A' <= c && c <= 'F':
			v = v<<4 | int(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}
