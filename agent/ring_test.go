package agent

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestRingKeepsTheLastBytesAtTheirOffsets writes a stream in random pieces
// into rings of several sizes and checks every read against the stream
// itself: the kept window is the stream's last size bytes, reads before it
// start at its first byte, and reads past the end return nothing.
func TestRingKeepsTheLastBytesAtTheirOffsets(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int64{1, 7, 64, 1000} {
		r := newRing(size)
		var stream []byte
		for range 200 {
			p := make([]byte, rng.IntN(int(3*size)+1))
			for i := range p {
				p[i] = byte(rng.IntN(256))
			}
			r.write(p)
			stream = append(stream, p...)
			total := int64(len(stream))
			if r.total != total {
				t.Fatalf("size %d: total %d, want %d", size, r.total, total)
			}
			if want := max(total-size, 0); r.start() != want {
				t.Fatalf("size %d: start %d, want %d", size, r.start(), want)
			}
			if int64(len(r.buf)) > size {
				t.Fatalf("size %d: buffer grew to %d", size, len(r.buf))
			}
			off := rng.Int64N(total + 2)
			n := rng.Int64N(2*size + 1)
			got, from := r.read(off, n)
			wantFrom := min(max(off, r.start()), total)
			want := stream[wantFrom:min(wantFrom+n, total)]
			if from != wantFrom || !bytes.Equal(got, want) {
				t.Fatalf("size %d: read(%d, %d) = %d bytes from %d, want %d bytes from %d", size, off, n, len(got), from, len(want), wantFrom)
			}
		}
	}
}

// TestRingOfSizeZeroCountsOnly: a ring that keeps nothing still counts.
func TestRingOfSizeZeroCountsOnly(t *testing.T) {
	r := newRing(0)
	r.write([]byte("hello"))
	got, from := r.read(0, 10)
	if r.total != 5 || len(got) != 0 || from != 5 {
		t.Fatalf("total %d, read %q from %d", r.total, got, from)
	}
}
