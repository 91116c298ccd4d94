package agentproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	payload := bytes.Repeat([]byte{0, 1, 0xff}, 1000)
	if err := w.Write(7, KindExec, ExecRequest{Argv: []string{"ls", "-l"}, Cwd: "."}, payload); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(0, KindPing, nil, nil); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&buf)
	f, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	var req ExecRequest
	if err := f.Decode(&req); err != nil {
		t.Fatal(err)
	}
	if f.ID != 7 || f.Kind != KindExec || req.Argv[1] != "-l" || !bytes.Equal(f.Payload, payload) {
		t.Fatalf("got %+v %+v", f.Header, req)
	}
	f, err = r.Read()
	if err != nil || f.Kind != KindPing || f.Payload != nil || len(f.Body) != 0 {
		t.Fatalf("second frame: %+v %v", f, err)
	}
	if _, err := r.Read(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
}

func TestFrameLimits(t *testing.T) {
	if err := NewWriter(io.Discard).Write(1, KindData, nil, make([]byte, MaxPayload+1)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized payload written: %v", err)
	}
	frame := func(hl, pl uint32, rest string) *Reader {
		var b bytes.Buffer
		binary.Write(&b, binary.BigEndian, hl)
		binary.Write(&b, binary.BigEndian, pl)
		b.WriteString(rest)
		return NewReader(&b)
	}
	for name, tc := range map[string]struct {
		r    *Reader
		want string
	}{
		"header too large":  {frame(MaxHeader+1, 0, ""), "size limits"},
		"payload too large": {frame(10, MaxPayload+1, ""), "size limits"},
		"empty header":      {frame(0, 0, ""), "size limits"},
		"cut inside":        {frame(20, 0, `{"id":1`), "unexpected EOF"},
		"not json":          {frame(3, 0, "abc"), "bad frame header"},
		"no kind":           {frame(8, 0, `{"id":1}`), "bad frame header: no kind"},
	} {
		_, err := tc.r.Read()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
	}
}

// TestWriterRefusesBeforeWriting: a frame over the limits is refused with
// ErrNotSent and ErrFrameTooLarge before a byte is written, so the next
// frame on the stream decodes.
func TestWriterRefusesBeforeWriting(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	// 11.5 KB of '<' is 69 KB of header once escaped (\u003c).
	big := ExecRequest{Argv: []string{"echo", strings.Repeat("<", 11500)}}
	err := w.Write(1, KindExec, big, nil)
	if !errors.Is(err, ErrNotSent) || !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("a header over MaxHeader: %v", err)
	}
	if err := w.Write(2, KindData, nil, make([]byte, MaxPayload+1)); !errors.Is(err, ErrNotSent) || !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("a payload over MaxPayload: %v", err)
	}
	if err := w.Write(3, KindExec, map[string]any{"bad": func() {}}, nil); !errors.Is(err, ErrNotSent) {
		t.Fatalf("a body that does not encode: %v", err)
	}
	if buf.Len() != 0 {
		t.Fatalf("%d bytes written for refused frames", buf.Len())
	}

	// The server's requests may be larger: a reader takes what its limit
	// allows, no more.
	w.MaxHeader = MaxRequestHeader
	if err := w.Write(4, KindExec, big, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(5, KindPing, nil, nil); err != nil {
		t.Fatal(err)
	}
	stream := bytes.Clone(buf.Bytes())
	if _, err := NewReader(bytes.NewReader(stream)).Read(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("a reader with the agent's limit took a %d-byte header: %v", len(stream), err)
	}
	r := NewReader(bytes.NewReader(stream))
	r.MaxHeader = MaxRequestHeader
	var got ExecRequest
	if f, err := r.Read(); err != nil || f.ID != 4 || f.Decode(&got) != nil || got.Argv[1] != big.Argv[1] {
		t.Fatalf("the large request: %v", err)
	}
	if f, err := r.Read(); err != nil || f.ID != 5 || f.Kind != KindPing {
		t.Fatalf("the frame after it: %+v %v", f, err)
	}
}

// A request's timeout travels in its header, rounded up to a millisecond.
func TestRequestTimeoutRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, d := range []time.Duration{1500 * time.Microsecond, time.Minute, 0, -time.Second} {
		if err := w.WriteRequest(3, KindRead, d, ReadRequest{Path: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	r := NewReader(&buf)
	for _, want := range []time.Duration{2 * time.Millisecond, time.Minute, 0, 0} {
		f, err := r.Read()
		if err != nil || f.Timeout() != want || f.Kind != KindRead {
			t.Fatalf("got %+v (timeout %v), %v; want a timeout of %v", f.Header, f.Timeout(), err, want)
		}
	}
	if h := (Header{TimeoutMillis: 1 << 62}); h.Timeout() <= 0 {
		t.Fatalf("a huge timeout reads as %v", h.Timeout())
	}
}

// TestResyncMarkers: the markers begin with sizes no frame may have, and
// SkipPast finds one after any bytes (a cut frame, runs of 0xff included),
// and only the one with the right token or nonce.
func TestResyncMarkers(t *testing.T) {
	m := ResyncMarker("tok")
	if string(m) != "\xff\xff\xff\xff\xff\xff\xff\xffsandbox-mcp resync tok\n" {
		t.Fatalf("marker %q", m)
	}
	if string(ResyncReply("n1")) != "\xff\xff\xff\xff\xff\xff\xff\xffsandbox-mcp resumed n1\n" {
		t.Fatalf("reply %q", ResyncReply("n1"))
	}
	if !IsMarkerStart(m[:8]) {
		t.Fatal("the marker's start is not recognised")
	}
	// At a frame boundary a reader that knows no marker refuses it as a
	// frame: a version 4 peer ends instead of misreading it.
	if _, err := NewReader(bytes.NewReader(m)).Read(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("a marker read as a frame: %v", err)
	}
	var after bytes.Buffer
	w := NewWriter(&after)
	if err := w.Write(0, KindResume, Resume{Nonce: "x"}, nil); err != nil {
		t.Fatal(err)
	}
	for _, before := range []string{
		"",
		"half a frame \x00\x00\x01",
		"\xff\xff\xff", // a short run of 0xff
		"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",               // a longer one
		"\xff\xff\xff\xff\xff\xff\xff\xffsandbox-mcp resync other\n", // another token
		"\xff\xff\xff\xff\xff\xff\xff\xffsandbox-mcp resync to",      // a cut one
	} {
		in := bufio.NewReader(bytes.NewReader(append(append([]byte(before), m...), after.Bytes()...)))
		if err := SkipPast(in, m, 1<<20); err != nil {
			t.Fatalf("after %q: %v", before, err)
		}
		r := &Reader{MaxHeader: MaxHeader, r: in}
		f, err := r.Read()
		if err != nil || f.Kind != KindResume {
			t.Fatalf("after %q the next frame is %v, %v", before, f.Kind, err)
		}
	}
	if err := SkipPast(bufio.NewReader(bytes.NewReader(ResyncMarker("other"))), m, 1<<20); err != io.EOF {
		t.Fatalf("a marker with another token was taken: %v", err)
	}
	if err := SkipPast(bufio.NewReader(bytes.NewReader(make([]byte, 100))), m, 50); !errors.Is(err, ErrMarkerNotFound) {
		t.Fatalf("past max: %v", err)
	}
}
