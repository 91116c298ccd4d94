package netproxy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"testing/iotest"
)

// scrubValues are values with and without characters that need escapes.
var scrubValues = []string{
	"ghp_R3alValue0123456789abcdef",
	`tok/Re+al=Va&lue"<é>'42 %2F\`,
}

func testScrubber(t testing.TB, values ...string) (*scrubber, []string) {
	t.Helper()
	var forms [][]form
	var phs []string
	for i, v := range values {
		phs = append(phs, fmt.Sprintf("sbx-secret-S%d-abcdefghijklmnopqrstuvwxyz", i))
		forms = append(forms, valueForms(v))
	}
	return &scrubber{scrubIndex: newScrubIndex(values, forms), placeholders: phs}, phs
}

// textEncodings are the ways a text may carry a value; each gives the text
// that must come out, with the placeholder, or "" when the encoding around
// the value cannot be kept (base64).
func textEncodings(v string) map[string]string {
	pct := func(s string, upper bool) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			f := "%%%02x"
			if upper {
				f = "%%%02X"
			}
			fmt.Fprintf(&b, f, s[i])
		}
		return b.String()
	}
	jsonOf := func(s string, escapeHTML bool) string {
		var b bytes.Buffer
		e := json.NewEncoder(&b)
		e.SetEscapeHTML(escapeHTML)
		e.Encode(s)
		return strings.TrimSuffix(strings.TrimSpace(b.String()), `"`)[1:]
	}
	allJSON := func(s string) string {
		var b strings.Builder
		for _, r := range s {
			if r > 0xFFFF {
				r1, r2 := 0xD800+(r-0x10000)>>10, 0xDC00+(r-0x10000)&0x3FF
				fmt.Fprintf(&b, `\u%04X\u%04x`, r1, r2)
				continue
			}
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		return b.String()
	}
	entities := func(s string, hex bool) string {
		var b strings.Builder
		for _, r := range s {
			if hex {
				fmt.Fprintf(&b, "&#x%X;", r)
			} else {
				fmt.Fprintf(&b, "&#%d;", r)
			}
		}
		return b.String()
	}
	jsx := func(s string) string { // JavaScript \x escapes for ASCII, \u for the rest
		var b strings.Builder
		for _, r := range s {
			if r < 0x80 {
				fmt.Fprintf(&b, `\x%02x`, r)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		}
		return b.String()
	}
	return map[string]string{
		"literal":             v,
		"query escape":        url.QueryEscape(v),
		"path escape":         url.PathEscape(v),
		"percent, lower hex":  pct(v, false),
		"percent, upper hex":  pct(v, true),
		"json":                jsonOf(v, true),
		"json, no html":       jsonOf(v, false),
		"json, every char":    allJSON(v),
		"javascript":          jsx(v),
		"html":                html.EscapeString(v),
		"html, decimal":       entities(v, false),
		"html, hex":           entities(v, true),
		"json of query":       jsonOf(url.QueryEscape(v), true),
		"mixed percent, json": url.QueryEscape(v[:len(v)/2]) + allJSON(v[len(v)/2:]),
	}
}

// base64Encodings are the value's base64 forms inside longer data.
func base64Encodings(v string) map[string]string {
	out := map[string]string{}
	for _, enc := range []struct {
		name string
		e    *base64.Encoding
	}{{"std", base64.StdEncoding}, {"url", base64.URLEncoding}, {"raw std", base64.RawStdEncoding}, {"raw url", base64.RawURLEncoding}} {
		for _, prefix := range []string{"", "x:", "user:"} {
			for _, suffix := range []string{"", "!", "?!"} {
				s := enc.e.EncodeToString([]byte(prefix + v + suffix))
				out[fmt.Sprintf("base64 %s of %q+v+%q", enc.name, prefix, suffix)] = s
				out[fmt.Sprintf("base64 %s of %q+v+%q, query-escaped", enc.name, prefix, suffix)] = url.QueryEscape(s)
			}
		}
	}
	return out
}

// TestScrubEncodings: every common encoding of a value, inside other text,
// comes out with the placeholder in its place; the text around it is kept.
func TestScrubEncodings(t *testing.T) {
	s, phs := testScrubber(t, scrubValues...)
	for i, v := range scrubValues {
		for name, enc := range textEncodings(v) {
			in := "before " + enc + " after"
			if got, want := s.scrubString(in), "before "+phs[i]+" after"; got != want {
				t.Errorf("value %d, %s: %q became %q, want %q", i, name, in, got, want)
			}
		}
		for name, enc := range base64Encodings(v) {
			in := `{"b":"` + enc + `"}`
			got := s.scrubString(in)
			if !strings.Contains(got, phs[i]) || !strings.HasPrefix(got, `{"b":"`) || !strings.HasSuffix(got, `"}`) {
				t.Errorf("value %d, %s: %q became %q, want the placeholder in the string", i, name, in, got)
			}
			for _, e := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
				s := strings.TrimSuffix(strings.TrimPrefix(got, `{"b":"`), `"}`)
				if raw, err := e.DecodeString(s); err == nil && strings.Contains(string(raw), v) {
					t.Errorf("value %d, %s: %q still decodes to the value", i, name, got)
				}
			}
		}
	}
	// Text that only looks like the start of a value, and escapes that
	// lead nowhere, are left alone.
	for _, in := range []string{"ghp_R3alValue012345678", "%zz %4", `\u12 \x`, "&amp &#xZZ; &#", "ghp_R3alValue0123456789abcdeX"[:10]} {
		if got := s.scrubString(in); got != in {
			t.Errorf("%q became %q", in, got)
		}
	}
}

// TestScrubHeaderKeepsBase64 : in a header, base64 that holds a value (a
// Basic credential) is decoded and encoded again with the placeholder, so
// the sandbox gets back what it sent.
func TestScrubHeaderKeepsBase64(t *testing.T) {
	s, phs := testScrubber(t, scrubValues...)
	for i, v := range scrubValues {
		for _, e := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			in := "Basic " + e.EncodeToString([]byte("x:"+v))
			want := "Basic " + e.EncodeToString([]byte("x:"+phs[i]))
			if got := s.scrubHeaderValue(in); got != want {
				t.Errorf("value %d: %q became %q, want %q", i, in, got, want)
			}
		}
	}
	h := http.Header{
		"Location": {"https://h.test/a?t=" + url.QueryEscape(scrubValues[1]) + "&b=" + base64.URLEncoding.EncodeToString([]byte(scrubValues[0]))},
		http.CanonicalHeaderKey("X-" + scrubValues[0]): {"1"},
		"Link": {"</x?t=" + scrubValues[0] + ">; rel=preload"},
	}
	s.scrubHeader(h)
	if got := h.Get("Location"); got != "https://h.test/a?t="+phs[1]+"&b="+base64.URLEncoding.EncodeToString([]byte(phs[0])) {
		t.Errorf("Location: %q", got)
	}
	if got := h.Get("Link"); got != "</x?t="+phs[0]+">; rel=preload" {
		t.Errorf("Link: %q", got)
	}
	if len(h) != 2 {
		t.Errorf("a header whose name holds the value was kept: %q", h)
	}
}

// TestScrubStream: a body scrubbed as it streams comes out as the whole
// text scrubbed at once, however it is cut: into two pieces at every
// offset, and a byte at a time. Nothing is held back that cannot begin a
// value.
func TestScrubStream(t *testing.T) {
	s, phs := testScrubber(t, scrubValues...)
	var body strings.Builder
	for i, v := range scrubValues {
		body.WriteString("<p>" + v + "</p>")
		for _, enc := range []string{url.QueryEscape(v), textEncodings(v)["json, every char"], base64.StdEncoding.EncodeToString([]byte("x:" + v)), html.EscapeString(v)} {
			fmt.Fprintf(&body, " [%d] %s ", i, enc)
		}
	}
	in := body.String()
	want := s.scrubString(in)
	for i, v := range scrubValues {
		if strings.Contains(want, v) || strings.Count(want, phs[i]) != 5 {
			t.Fatalf("the whole text scrubbed: %q", want)
		}
	}
	read := func(r io.Reader) string {
		t.Helper()
		out, err := io.ReadAll(newScrubReader(s, r, nil))
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	for cut := 0; cut <= len(in); cut++ {
		if got := read(io.MultiReader(strings.NewReader(in[:cut]), strings.NewReader(in[cut:]))); got != want {
			t.Fatalf("cut at %d: %q, want %q", cut, got, want)
		}
	}
	if got := read(iotest.OneByteReader(strings.NewReader(in))); got != want {
		t.Errorf("a byte at a time: %q", got)
	}
	// A stream that ends in text that cannot begin a value is passed on
	// whole as it comes: nothing is held back for the next chunk.
	pr, pw := io.Pipe()
	r := newScrubReader(s, pr, nil)
	go pw.Write([]byte("data: {\"x\": 1}\n\n"))
	buf := make([]byte, 100)
	if n, _ := r.Read(buf); string(buf[:n]) != "data: {\"x\": 1}\n\n" {
		t.Errorf("first event: %q", buf[:n])
	}
	pw.Close()
}

// TestScrubBounds: a body made to look like the start of a value again
// and again is scrubbed in time linear in its length (the look-behind is
// bounded), and what is held back is shorter than the longest form.
func TestScrubBounds(t *testing.T) {
	s, _ := testScrubber(t, scrubValues...)
	v := scrubValues[1]
	in := strings.Repeat(url.QueryEscape(v[:len(v)-1]), 2000)
	got := s.scrubString(in)
	if got != in {
		t.Error("a body of near misses was changed")
	}
	_, rest := s.scrub(nil, []byte(url.QueryEscape(v[:len(v)-1])), false)
	if len(rest) == 0 || len(rest) >= s.maxLen {
		t.Errorf("held back %d bytes of a partial match, want 0 < n < %d", len(rest), s.maxLen)
	}
	if want := maxUnitBytes * (4*len(v)/3 + 3); s.maxLen > want { // the base64 forms are the longest
		t.Errorf("maxLen %d, want at most %d", s.maxLen, want)
	}
}

func BenchmarkScrub(b *testing.B) {
	s, _ := testScrubber(b, "ghp_R3alValue0123456789abcdef")
	for name, chunk := range map[string][]byte{
		"json": bytes.Repeat([]byte(`{"id": 12345, "name": "repository-name", "url": "https:\/\/api.example.com\/repos\/org\/repository-name?page=2&per_page=100", "private": false},`+"\n"), 400),
		"binary": func() []byte {
			b := make([]byte, 64<<10)
			for i := range b {
				b[i] = byte(i * 7919 >> 3)
			}
			return b
		}(),
	} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(chunk)))
			var out []byte
			for b.Loop() {
				out, _ = s.scrub(out[:0], chunk, true)
			}
		})
	}
}
