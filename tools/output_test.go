package tools

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// TestProgressFlushesOnItsOwn: output waiting in the progress buffer goes
// out without a next chunk to push it; each stream has its own labelled
// notifications; a rune cut between chunks is sent whole; done sends what
// is left and nothing follows it.
func TestProgressFlushesOnItsOwn(t *testing.T) {
	var mu sync.Mutex
	var msgs []string
	got := make(chan struct{}, 100)
	p := &progress{notify: func(_ float64, msg string) {
		mu.Lock()
		msgs = append(msgs, msg)
		mu.Unlock()
		got <- struct{}{}
	}}
	p.output("stdout", []byte("one\n"))
	p.output("stderr", []byte("err\n"))
	p.output("stdout", []byte("two \xe2\x82")) // the first two bytes of €
	for range 2 {
		select {
		case <-got:
		case <-time.After(30 * time.Second):
			t.Fatal("buffered output was never sent on its own")
		}
	}
	p.output("stdout", []byte("\xac!\n"))
	p.done()
	p.output("stdout", []byte("late\n"))
	mu.Lock()
	defer mu.Unlock()
	var out, errs strings.Builder
	for _, m := range msgs {
		stream, body, _ := strings.Cut(m, ": ")
		switch stream {
		case "stdout":
			out.WriteString(body)
		case "stderr":
			errs.WriteString(body)
		default:
			t.Fatalf("an unlabelled notification: %q", m)
		}
		if strings.Contains(body, "\uFFFD") {
			t.Fatalf("a rune cut in two: %q", m)
		}
	}
	if out.String() != "one\ntwo €!\n" || errs.String() != "err\n" {
		t.Fatalf("stdout %q, stderr %q from %q", out.String(), errs.String(), msgs)
	}
}

func TestCutStreamSaysWhereTheRestIs(t *testing.T) {
	s := cutStream{name: "stdout", head: []byte("head"), tail: []byte("tail\n"), omitted: 1000, job: "7"}
	if got := s.text(); got != "head\n[... 1000 bytes of stdout were left out after its first 4; read them with sandbox_job (job \"7\", stdout_offset 4) ...]\ntail\n" {
		t.Fatalf("text: %q", got)
	}
	whole := cutStream{name: "stderr", head: []byte("all\n")}
	if whole.text() != "all\n" || whole.note() != "" {
		t.Fatalf("whole: %q %q", whole.text(), whole.note())
	}
	for code, want := range map[int]string{0: "", 1: "failed", 127: "did not find", 137: "signal 9 (SIGKILL)"} {
		if got := exitMeaning(code, "", false); !strings.Contains(got, want) || (want == "") != (got == "") {
			t.Errorf("exitMeaning(%d) = %q, want %q in it", code, got, want)
		}
	}
	// A failure whose stderr says why needs no sentence saying so; what
	// an exit code always means is still said.
	if got := exitMeaning(1, "", true); got != "" {
		t.Errorf("exitMeaning(1) with stderr = %q, want none", got)
	}
	if got := exitMeaning(127, "", true); !strings.Contains(got, "did not find") {
		t.Errorf("exitMeaning(127) with stderr = %q", got)
	}
	if got := joinHints("a.", "", " b "); got != "a. b." {
		t.Fatalf("joinHints: %q", got)
	}
}
