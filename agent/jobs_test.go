package agent

import (
	"fmt"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

func TestSplitBudget(t *testing.T) {
	for _, tc := range []struct{ max, a, b, wa, wb int64 }{
		{100, 10, 20, 10, 20},
		{100, 10, 500, 10, 90},
		{100, 500, 30, 70, 30},
		{100, 500, 500, 50, 50},
		{0, 5, 5, 0, 0},
	} {
		if a, b := splitBudget(tc.max, tc.a, tc.b); a != tc.wa || b != tc.wb {
			t.Errorf("splitBudget(%d, %d, %d) = %d, %d; want %d, %d", tc.max, tc.a, tc.b, a, b, tc.wa, tc.wb)
		}
	}
}

func newTestJob(id uint64) *job {
	return &job{id: id, changed: make(chan struct{}), stdinSem: make(chan struct{}, 1), out: [2]ring{newRing(10), newRing(10)}}
}

// TestJobTableBoundsRunningAndKeptJobs: past maxRunning running jobs a new
// one is BUSY; ended jobs beyond maxRunning are dropped oldest first, and
// running ones never are; a dropped job is NOT_FOUND.
func TestJobTableBoundsRunningAndKeptJobs(t *testing.T) {
	tab := newJobTable()
	var jobs []*job
	for i := range 3 {
		j := newTestJob(uint64(i + 1))
		if err := tab.add(j, 3); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, j)
	}
	err := tab.add(newTestJob(4), 3)
	if e, ok := errcode.As(err); !ok || e.Code != errcode.Busy {
		t.Fatalf("a fourth running job: %v", err)
	}
	if err := tab.add(newTestJob(1), 0); err == nil {
		t.Fatal("a job id used twice was taken")
	}
	// Jobs 1 and 2 end; 3 runs on. Adding 4 .. 7 keeps 3 ended jobs at most.
	jobs[0].finish(nil, false)
	jobs[1].finish(nil, false)
	for id := uint64(4); id <= 7; id++ {
		j := newTestJob(id)
		if err := tab.add(j, 3); err != nil {
			t.Fatalf("job %d: %v", id, err)
		}
		j.finish(nil, false)
	}
	var kept []uint64
	for _, j := range tab.list() {
		kept = append(kept, j.id)
	}
	// 3 (running) stays; of the ended 1, 2, 4, 5, 6, 7 the newest 3 are kept.
	if fmt.Sprint(kept) != "[3 5 6 7]" {
		t.Fatalf("kept %v", kept)
	}
	if _, err := tab.get(1); err == nil {
		t.Fatal("the oldest ended job was not dropped")
	}
	if e, ok := errcode.As(func() error { _, err := tab.get(1); return err }()); !ok || e.Code != errcode.NotFound {
		t.Fatalf("a dropped job: %v", e)
	}
}
