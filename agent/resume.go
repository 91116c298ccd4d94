package agent

import (
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// resume hands the agent to a server that took over the stream (after a
// resync marker): the requests of the server that is gone end (a
// foreground exec is detached and runs on as a job, as KindDetach does;
// any other request is cancelled), and only then, once none of them can
// write another frame, the agent writes the reply marker and KindResumed,
// so the new server reads nothing of the old connection after the marker.
// Jobs, their kept output and the lease are the agent's and carry over.
// It runs on the dispatch loop: the new server's next frames wait for it.
func (s *server) resume(r agentproto.Resume) {
	var detached, cancelled int
	s.mu.Lock()
	for _, c := range s.calls {
		if c.detach != nil {
			c.detachOnce.Do(func() { close(c.detach) })
			detached++
			continue
		}
		c.cancel()
		if c.in != nil {
			c.in.close()
		}
		cancelled++
	}
	s.mu.Unlock()
	s.wg.Wait()
	res := agentproto.Resumed{Hello: s.hello, Jobs: []agentproto.JobStatus{}, LeaseMillis: time.Duration(s.leaseTTL.Load()).Milliseconds(),
		Detached: detached, Cancelled: cancelled}
	for _, j := range s.jobs.list() {
		j.mu.Lock()
		res.Jobs = append(res.Jobs, j.statusLocked())
		j.mu.Unlock()
	}
	s.wmu.Lock()
	err := s.w.WriteRaw(agentproto.ResyncReply(r.Nonce))
	if err == nil {
		err = s.w.Write(0, agentproto.KindResumed, res, nil)
	}
	s.wmu.Unlock()
	if err != nil {
		s.log.Warn("send resumed", "err", err)
		return
	}
	s.log.Info("a server took over", "jobs", len(res.Jobs), "detached", detached, "cancelled", cancelled)
}
