package agent

import (
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestExecEnv: a command's environment is the agent's base, then the
// request's variables (later ones win in the program), then PWD as the
// sandbox sees the working directory; the base is not changed.
func TestExecEnv(t *testing.T) {
	base := make([]string, 2, 8) // room after the base must not be written to
	copy(base, []string{"PATH=/bin", "HOME=/home/sandbox"})
	for _, tc := range []struct {
		extra []string
		cwd   string
		want  []string
	}{
		{nil, ".", []string{"PATH=/bin", "HOME=/home/sandbox", "PWD=/workspace"}},
		{[]string{"A=1"}, "src/pkg", []string{"PATH=/bin", "HOME=/home/sandbox", "A=1", "PWD=/workspace/src/pkg"}},
		{[]string{"PATH=/x", "PWD=/elsewhere"}, "d/", []string{"PATH=/bin", "HOME=/home/sandbox", "PATH=/x", "PWD=/elsewhere", "PWD=/workspace/d"}},
	} {
		got := execEnv(base, tc.extra, "/workspace", tc.cwd)
		if !slices.Equal(got, tc.want) {
			t.Errorf("execEnv(%q, %q) = %q, want %q", tc.extra, tc.cwd, got, tc.want)
		}
		if full := base[:cap(base)]; full[2] != "" {
			t.Fatalf("execEnv wrote into the base's spare room: %q", full)
		}
	}
}

// TestJobLabel: a label past maxLabel bytes is cut on a character boundary
// and marked; a shorter one is kept whole.
func TestJobLabel(t *testing.T) {
	if got := jobLabel("go test ./..."); got != "go test ./..." {
		t.Errorf("short label = %q", got)
	}
	exact := strings.Repeat("a", maxLabel)
	if got := jobLabel(exact); got != exact {
		t.Errorf("a label of exactly maxLabel bytes was cut to %d", len(got))
	}
	long := strings.Repeat("a", maxLabel-1) + "é" + "tail" // é straddles the cut
	got := jobLabel(long)
	if !strings.HasSuffix(got, "...") || !utf8.ValidString(got) || len(got) > maxLabel+3 {
		t.Errorf("long label = %q (%d bytes): want at most %d bytes of valid UTF-8, then ...", got, len(got), maxLabel)
	}
	if want := strings.Repeat("a", maxLabel-1) + "..."; got != want {
		t.Errorf("long label = %q, want the whole characters before the cut and ...", got)
	}
}

// TestLiveChunk: live output stops at the request's MaxOutput per stream.
func TestLiveChunk(t *testing.T) {
	p := []byte("0123456789")
	for _, tc := range []struct {
		limit, sent int64
		want        string
	}{
		{0, 0, ""},
		{100, 0, "0123456789"},
		{10, 0, "0123456789"},
		{4, 0, "0123"},
		{10, 7, "012"},
		{10, 10, ""},
		{10, 12, ""},
	} {
		if got := string(liveChunk(tc.limit, tc.sent, p)); got != tc.want {
			t.Errorf("liveChunk(%d, %d) = %q, want %q", tc.limit, tc.sent, got, tc.want)
		}
	}
}

// TestStopCause: how a stopped command is reported.
func TestStopCause(t *testing.T) {
	for _, tc := range []struct {
		requestEnded, background, connectionEnded bool
		cancelled, timedOut                       bool
	}{
		// A foreground command whose request ended was cancelled, even if
		// the connection ended too.
		{true, false, false, true, false},
		{true, false, true, true, false},
		// A foreground command stopped otherwise hit its timeout, even as
		// the connection ends.
		{false, false, false, false, true},
		{false, false, true, false, true},
		// A background job (or a detached one) does not end with the
		// request: it timed out, unless the connection ended, which is
		// neither.
		{true, true, false, false, true},
		{false, true, false, false, true},
		{false, true, true, false, false},
		{true, true, true, false, false},
	} {
		c, to := stopCause(tc.requestEnded, tc.background, tc.connectionEnded)
		if c != tc.cancelled || to != tc.timedOut {
			t.Errorf("stopCause(request ended %v, background %v, connection ended %v) = cancelled %v, timed out %v; want %v, %v",
				tc.requestEnded, tc.background, tc.connectionEnded, c, to, tc.cancelled, tc.timedOut)
		}
	}
}

// TestNewPipes: the three pipes are distinct and connected, and closeAll
// closes every end.
func TestNewPipes(t *testing.T) {
	p, err := newPipes()
	if err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]*os.File{{p.outR, p.outW}, {p.errR, p.errW}, {p.inR, p.inW}} {
		if _, err := pair[1].Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		if n, err := pair[0].Read(b); n != 1 || err != nil || b[0] != 'x' {
			t.Fatalf("read %d %v", n, err)
		}
	}
	p.closeAll()
	if _, err := p.inW.Write([]byte("x")); err == nil {
		t.Error("a pipe end was still open after closeAll")
	}
}
