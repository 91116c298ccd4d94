package agentclient

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// maxResumeScan bounds what a resuming server reads and drops before the
// agent's reply marker: the rest of what the agent wrote for the old
// connection (at most a few frames of its calls, which it ends before it
// answers).
const maxResumeScan = 64 << 20

// maxResumedJobs bounds the job list a resumed agent may report: it keeps
// at most 2 × --max-jobs + 1, and --max-jobs is far below this.
const maxResumedJobs = 4096

// NewToken returns a fresh resume token for New's lease.
func NewToken() string { return randomHex(32) }

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}

// Resume takes over a running agent whose earlier server is gone, over a
// new stream to it (for a container, a new attach: the agent's stdin is
// the same pipe, so the old server's last frame may lie in it half-sent).
// It stays silent for quiet (agentproto.ResumeQuiet; tests pass less) so
// that the agent has dropped such a frame, sends the resync marker with
// token (the one the first server gave in its lease) and KindResume, drops
// what it reads up to the agent's reply marker, and checks KindResumed.
// Then it sends the lease again (with token) and returns the connection
// and the agent's jobs. On failure raw is closed.
func Resume(ctx context.Context, r io.Reader, w io.Writer, raw io.Closer, token string, lease, quiet time.Duration, log *slog.Logger) (*Conn, agentproto.Resumed, error) {
	var res agentproto.Resumed
	if token == "" {
		raw.Close()
		return nil, res, errors.New("no resume token: the agent was started without one")
	}
	c := newConn(w, raw, log)
	reader := agentproto.NewReader(r)
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	defer stop()
	fail := func(err error) (*Conn, agentproto.Resumed, error) {
		raw.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
		}
		return nil, res, err
	}
	select {
	case <-time.After(quiet):
	case <-ctx.Done():
		return fail(errors.New("resuming the agent"))
	}
	nonce := randomHex(16)
	if err := c.w.WriteRaw(agentproto.ResyncMarker(token)); err != nil {
		return fail(fmt.Errorf("sending the resync marker: %w", err))
	}
	if err := c.send(0, agentproto.KindResume, agentproto.Resume{Nonce: nonce}, nil); err != nil {
		return fail(fmt.Errorf("sending the resume: %w", err))
	}
	if err := reader.SkipPast(agentproto.ResyncReply(nonce), maxResumeScan); err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("the agent's stream ended (the agent is gone)")
		}
		return fail(fmt.Errorf("waiting for the agent's answer to the resume: %w", err))
	}
	f, err := reader.Read()
	switch {
	case err != nil:
		return fail(fmt.Errorf("reading the agent's answer to the resume: %w", err))
	case f.Kind != agentproto.KindResumed || f.ID != 0:
		return fail(fmt.Errorf("%w: a %q frame on id %d in answer to the resume", errProtocol, f.Kind, f.ID))
	}
	if err := f.Decode(&res); err != nil {
		return fail(fmt.Errorf("%w: %v", errProtocol, err))
	}
	if res.Hello.Version != agentproto.Version {
		return fail(fmt.Errorf("the agent speaks protocol %d, this server speaks %d", res.Hello.Version, agentproto.Version))
	}
	if len(res.Jobs) > maxResumedJobs {
		return fail(fmt.Errorf("%w: %d jobs in the resume", errProtocol, len(res.Jobs)))
	}
	for _, j := range res.Jobs {
		if j.Job == 0 || !validStatus(j, 0) {
			return fail(fmt.Errorf("%w: a bad job status in the resume", errProtocol))
		}
		c.maxJob = max(c.maxJob, j.Job)
	}
	c.hello = res.Hello
	if err := c.send(0, agentproto.KindLease, agentproto.Lease{TTLMillis: lease.Milliseconds(), Token: token}, nil); err != nil {
		return fail(fmt.Errorf("sending the lease: %w", err))
	}
	if !stop() {
		return fail(errors.New("resuming the agent"))
	}
	go c.readLoop(reader)
	return c, res, nil
}

// MaxJob is the highest job id this connection knows (sent, or reported
// by a resumed agent).
func (c *Conn) MaxJob() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxJob
}
