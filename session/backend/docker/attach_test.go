package docker

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/moby/moby/api/pkg/stdcopy"
)

// muxed builds an attach stream as the engine frames it.
type muxed struct{ buf bytes.Buffer }

func (m *muxed) chunk(stream stdcopy.StdType, s string) *muxed {
	hdr := [8]byte{byte(stream)}
	binary.BigEndian.PutUint32(hdr[4:], uint32(len(s)))
	m.buf.Write(hdr[:])
	m.buf.WriteString(s)
	return m
}

func (m *muxed) out(s string) *muxed { return m.chunk(stdcopy.Stdout, s) }
func (m *muxed) err(s string) *muxed { return m.chunk(stdcopy.Stderr, s) }

// TestDemuxAttach: the frames reader yields exactly the stdout chunks, in
// order, whatever sizes the reads come in; stderr chunks between them go to
// the log's tail; the end is io.EOF.
func TestDemuxAttach(t *testing.T) {
	var m muxed
	m.out("frame-1").err("agent: starting\n").out("").out("frame-2|").err("warn: half a line ").out("frame-3").err("done\n")
	r, tail := demuxAttach(iotest.OneByteReader(bytes.NewReader(m.buf.Bytes())), slog.New(slog.DiscardHandler))
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "frame-1frame-2|frame-3" {
		t.Fatalf("frames %q, %v", got, err)
	}
	if tl := tail.tail(); tl != "agent: starting | warn: half a line done" {
		t.Errorf("stderr tail %q", tl)
	}
	if n, err := r.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Errorf("read after the end: %d, %v", n, err)
	}
}

// TestDemuxAttachMatchesStdCopy: on random interleavings the reader agrees
// with moby's own StdCopy.
func TestDemuxAttachMatchesStdCopy(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100 {
		var m muxed
		for range rng.IntN(20) {
			s := strings.Repeat(string(rune('a'+rng.IntN(26))), rng.IntN(9000))
			if rng.IntN(3) == 0 {
				m.err(s + "\n")
			} else {
				m.out(s)
			}
		}
		var wantOut, wantErr bytes.Buffer
		if _, err := stdcopy.StdCopy(&wantOut, &wantErr, bytes.NewReader(m.buf.Bytes())); err != nil {
			t.Fatal(err)
		}
		r, _ := demuxAttach(iotest.HalfReader(bytes.NewReader(m.buf.Bytes())), slog.New(slog.DiscardHandler))
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, wantOut.Bytes()) {
			t.Fatalf("demuxed %d bytes (%v), StdCopy %d", len(got), err, wantOut.Len())
		}
	}
}

// TestDemuxAttachBrokenStreams: a stream cut inside a header or a chunk, an
// engine error and an unknown stream are errors, never a clean end.
func TestDemuxAttachBrokenStreams(t *testing.T) {
	var whole muxed
	whole.out("0123456789")
	sys := []byte{byte(stdcopy.Systemerr), 0, 0, 0, 0, 0, 0, 4, 'o', 'o', 'p', 's'}
	for _, c := range []struct {
		name   string
		stream []byte
		want   string
	}{
		{"cut in a header", whole.buf.Bytes()[:5], "unexpected EOF"},
		{"cut in a chunk", whole.buf.Bytes()[:12], "unexpected EOF"},
		{"engine error", sys, "the engine reported an error on the attach stream: oops"},
		{"unknown stream", []byte{9, 0, 0, 0, 0, 0, 0, 1, 'x'}, "unknown stream 9"},
	} {
		r, _ := demuxAttach(bytes.NewReader(c.stream), slog.New(slog.DiscardHandler))
		_, err := io.ReadAll(r)
		if err == nil || errors.Is(err, io.EOF) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}
