package session

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// A read arrives in a buffer that starts at one chunk and grows once: every
// size around the chunk comes back exactly, and a length caps it.
func TestReadFileSizes(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(7, 8))
	const chunk = agentproto.ChunkSize
	for _, n := range []int{0, 1, chunk - 1, chunk, chunk + 1, 3*chunk + 5} {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(r.IntN(256))
		}
		if _, err := sb.WriteFile(ctx, "f", data, false, 0o644); err != nil {
			t.Fatal(err)
		}
		res, err := sb.ReadFile(ctx, "f", 0, 0, 4*chunk)
		if err != nil {
			t.Fatalf("read %d bytes: %v", n, err)
		}
		if !bytes.Equal(res.Data, data) || res.Size != int64(n) || res.Truncated {
			t.Fatalf("read of a %d-byte file: %d bytes (equal %v), size %d, truncated %v", n, len(res.Data), bytes.Equal(res.Data, data), res.Size, res.Truncated)
		}
		if n > 10 {
			res, err := sb.ReadFile(ctx, "f", 3, int64(n-10), 4*chunk)
			if err != nil || !bytes.Equal(res.Data, data[3:n-7]) {
				t.Fatalf("read of %d bytes from offset 3: %d bytes, %v", n-10, len(res.Data), err)
			}
		}
	}
	// The cap cuts a read short.
	res, err := sb.ReadFile(ctx, "f", 0, 0, chunk+3)
	if err != nil || len(res.Data) != chunk+3 || !res.Truncated {
		t.Fatalf("capped read: %d bytes, truncated %v, %v", len(res.Data), res.Truncated, err)
	}
}

// failingReader gives n bytes, then fails.
type failingReader struct {
	n   int
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n == 0 {
		return 0, f.err
	}
	k := min(len(p), f.n)
	clear(p[:k])
	f.n -= k
	return k, nil
}

// A streamed write whose input fails, or ends before its size, reports the
// input's failure and leaves the file as it was; the sandbox goes on.
func TestWriteFileFromShortInputLeavesTheFile(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	ctx := context.Background()
	if _, err := sb.WriteFile(ctx, "keep", []byte("old content"), false, 0o644); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("the content could not be decoded")
	_, err := sb.WriteFileFrom(ctx, "keep", &failingReader{n: 3 * agentproto.ChunkSize / 2, err: cause}, 4*agentproto.ChunkSize, false, 0o644)
	if !errors.Is(err, cause) {
		t.Fatalf("err = %v, want the input's own error", err)
	}
	_, err = sb.WriteFileFrom(ctx, "keep", strings.NewReader("short"), 100, false, 0o644)
	if err == nil || !strings.Contains(err.Error(), "ended after 5 of 100 bytes") {
		t.Fatalf("err = %v, want the short input named", err)
	}
	res, err := sb.ReadFile(ctx, "keep", 0, 0, 1<<20)
	if err != nil || string(res.Data) != "old content" {
		t.Fatalf("after failed writes the file holds %q (%v), want it unchanged", res.Data, err)
	}
	if _, err := sb.WriteFileFrom(ctx, "keep", strings.NewReader("new"), 3, true, 0o644); err != nil {
		t.Fatal(err)
	}
	if res, _ := sb.ReadFile(ctx, "keep", 0, 0, 1<<20); string(res.Data) != "old contentnew" {
		t.Fatalf("append after the failures: %q", res.Data)
	}
}

// A listing whose entries pass their byte cap (long paths) is cut short and
// reported truncated, with the entries that fit.
func TestListStopsAtItsByteCap(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	ctx := context.Background()
	// 60 files of about 500-byte paths: each entry's line is about 600
	// bytes, above the cap's 512 a line on average.
	dir := strings.Repeat("d", 250)
	sh(t, sb, `mkdir `+dir+` && cd `+dir+` && i=0; while [ $i -lt 60 ]; do : > "$i-`+strings.Repeat("f", 240)+`"; i=$((i+1)); done`)
	entries, truncated, err := listed(sb.List(ctx, dir, ListOptions{Recursive: false, MaxEntries: 60}))
	if err != nil {
		t.Fatal(err)
	}
	if !truncated || len(entries) == 0 || len(entries) >= 60 {
		t.Fatalf("list of 60 long entries with max 60: %d entries, truncated %v; want fewer, truncated", len(entries), truncated)
	}
	// Short names fit: the same count is listed whole.
	sh(t, sb, `mkdir short && cd short && i=0; while [ $i -lt 60 ]; do : > $i; i=$((i+1)); done`)
	entries, truncated, err = listed(sb.List(ctx, "short", ListOptions{Recursive: false, MaxEntries: 60}))
	if err != nil || truncated || len(entries) != 60 {
		t.Fatalf("list of 60 short entries: %d, truncated %v, %v", len(entries), truncated, err)
	}
}
