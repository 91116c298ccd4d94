package tools

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/session"

	"golang.org/x/sys/unix"
)

// toText returns output as valid UTF-8, replacing invalid bytes.
func toText(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// cutStream is one stream as a result shows it: its head, and when the
// output cap cut it, the line that says what was left out and its tail.
type cutStream struct {
	name     string // stdout or stderr
	head     []byte
	tail     []byte
	omitted  int64 // bytes left out between head and tail
	dropped  int64 // the oldest bytes the job no longer keeps
	job      string
	notUTF8  bool
	shownAll bool
}

// offsetArg is the sandbox_job argument that reads the stream.
func (s cutStream) offsetArg() string { return s.name + "_offset" }

// note is the sentence that says what was left out and how to read it;
// "" when nothing was. It offers no offset whose bytes the job dropped.
func (s cutStream) note() string {
	if s.omitted <= 0 {
		return ""
	}
	head := int64(len(s.head))
	switch {
	case s.dropped >= head+s.omitted:
		return fmt.Sprintf("%d bytes of %s were left out after its first %d, and its job no longer keeps them (it keeps the last of each stream)",
			s.omitted, s.name, head)
	case s.dropped > head:
		return fmt.Sprintf("%d bytes of %s were left out after its first %d; its job keeps them from byte %d on: read them with sandbox_job (job %q, %s %d)",
			s.omitted, s.name, head, s.dropped, s.job, s.offsetArg(), s.dropped)
	}
	return fmt.Sprintf("%d bytes of %s were left out after its first %d; read them with sandbox_job (job %q, %s %d)",
		s.omitted, s.name, head, s.job, s.offsetArg(), head)
}

// longLog is the hint for output too long to read through results: a
// file and a search read it better.
const longLog = "For output this long, send it to a file (command: \"make > build.log 2>&1\") and read what matters with rg (rg -n error build.log) or tail (tail -n 50 build.log)"

// text joins head, the cut line and tail.
func (s cutStream) text() string {
	if s.omitted <= 0 {
		return toText(s.head) + toText(s.tail)
	}
	head := toText(s.head)
	if head != "" && !strings.HasSuffix(head, "\n") {
		head += "\n"
	}
	return head + "[... " + s.note() + " ...]\n" + toText(s.tail)
}

// exitMeaning says what an exit code usually means, for the hint. The
// generic sentence for a failure is left out when the command wrote to
// stderr (wroteStderr): the model reads why there.
func exitMeaning(code int, signal string, wroteStderr bool) string {
	switch {
	case code == 0:
		return ""
	case signal != "":
		return fmt.Sprintf("exit code %d: a signal (%s) ended the command", code, signal)
	case code == 126:
		return "exit code 126: the program was found but could not be run (not executable, or a directory)"
	case code == 127:
		return "exit code 127: the shell did not find the command; check its name and that it is installed in the image"
	case code > 128 && code < 128+65:
		return fmt.Sprintf("exit code %d: the command died of signal %d (%s)", code, code-128, unix.SignalName(unix.Signal(code-128)))
	case wroteStderr:
		return ""
	}
	return fmt.Sprintf("exit code %d: the command failed and wrote nothing to stderr; its stdout may say why", code)
}

// joinHints joins the non-empty sentences.
func joinHints(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, strings.TrimSuffix(p, ".")+".")
		}
	}
	return strings.Join(out, " ")
}

// progress sends a command's output as progress notifications: each stream
// apart (its own notifications, labelled), within progressEvery of being
// written (a timer flushes what waits, not the next chunk), and everything
// before the result (done flushes what is left). The output it sees is
// bounded by the result's cap (the agent streams no more), so nothing is
// dropped.
type progress struct {
	// notify sends one notification: the bytes sent so far in all, and the
	// message.
	notify func(sent float64, msg string)
	// limit is the live output the agent sends per stream (0: no limit);
	// onCapped, if set, runs once for a stream whose live output reached it,
	// so that what follows can be fetched another way (followJob).
	limit    int64
	onCapped func(stream int)
	live     [2]int64
	capped   [2]bool

	sendMu sync.Mutex // orders notifications
	mu     sync.Mutex
	bufs   [2][]byte // stdout, stderr
	timer  *time.Timer
	sent   float64
	closed bool
}

// progressEvery is the longest output waits before it is sent.
const progressEvery = 200 * time.Millisecond

func newProgress(ctx context.Context, ss *mcp.ServerSession, token any) *progress {
	return &progress{notify: func(sent float64, msg string) {
		_ = ss.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: sent, Message: msg})
	}}
}

// output takes a chunk of a stream ("stdout" or "stderr").
func (p *progress) output(stream string, chunk []byte) {
	i := 0
	if stream == "stderr" {
		i = 1
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.bufs[i] = append(p.bufs[i], chunk...)
	if p.timer == nil {
		p.timer = time.AfterFunc(progressEvery, p.flush)
	}
	p.live[i] += int64(len(chunk))
	if p.limit > 0 && p.live[i] >= p.limit && !p.capped[i] && p.onCapped != nil {
		p.capped[i] = true
		p.onCapped(i) // starts a goroutine; called on the exec's own goroutine, before the exec returns
	}
}

// more takes output of stream i that did not come live (see followJob).
func (p *progress) more(i int, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(b) == 0 {
		return
	}
	p.bufs[i] = append(p.bufs[i], b...)
	if p.timer == nil {
		p.timer = time.AfterFunc(progressEvery, p.flush)
	}
}

// followChunk bounds one read of a stream past its live output: progress
// carries at most this much of it per progressEvery.
const followChunk = 8 << 10

// followJob sends a stream's output past what the agent streams live as
// progress, reading it from the job every progressEvery (at most
// followChunk each time, the latest when the command writes faster, with a
// line saying what was skipped) until ctx ends. The reads peek: the
// model's next sandbox_job read is not moved by them.
func followJob(ctx context.Context, read func(context.Context, session.JobRequest) (session.JobResult, error), job string, stream int, from int64, p *progress) {
	t := time.NewTicker(progressEvery)
	defer t.Stop()
	next := from
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		off := [2]int64{1 << 62, 1 << 62}
		off[stream] = next
		r, err := read(ctx, session.JobRequest{Job: job, StdoutOffset: off[0], StderrOffset: off[1], Max: followChunk, Peek: true})
		if err != nil {
			continue // not started yet, or ending: the result says the rest
		}
		total := [2]int64{r.Status.StdoutBytes, r.Status.StderrBytes}[stream]
		if r.From[stream] > next {
			p.more(stream, fmt.Appendf(nil, "\n[... %d bytes no longer kept ...]\n", r.From[stream]-next))
		}
		p.more(stream, r.Out[stream])
		next = r.From[stream] + int64(len(r.Out[stream]))
		if behind := total - next; behind > 2*followChunk {
			// The command writes faster than progress carries: jump to
			// its latest output.
			p.more(stream, fmt.Appendf(nil, "\n[... %d bytes skipped; the result and sandbox_job have them ...]\n", behind-followChunk))
			next = total - followChunk
		}
	}
}

// flush sends what waits, stdout first.
func (p *progress) flush() {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	p.mu.Lock()
	bufs := p.bufs
	p.bufs = [2][]byte{}
	p.timer = nil
	p.mu.Unlock()
	for i, b := range bufs {
		if len(b) == 0 {
			continue
		}
		// A rune cut between two chunks: keep its start for the next one.
		if keep := len(b) - len(trimPartialRune(b)); keep > 0 && keep < len(b) {
			p.mu.Lock()
			p.bufs[i] = append(append([]byte{}, b[len(b)-keep:]...), p.bufs[i]...)
			p.mu.Unlock()
			b = b[:len(b)-keep]
		}
		p.sent += float64(len(b))
		p.notify(p.sent, [2]string{"stdout", "stderr"}[i]+": "+toText(b))
	}
}

// done sends everything left; no notification follows it.
func (p *progress) done() {
	p.mu.Lock()
	if p.timer != nil {
		p.timer.Stop()
	}
	p.mu.Unlock()
	p.flush()
	p.flush() // what a cut rune held back
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
}

// trimPartialRune drops a UTF-8 sequence cut short at the end of b.
func trimPartialRune(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			break
		}
	}
	return b
}
