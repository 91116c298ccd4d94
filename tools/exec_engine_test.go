package tools

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// TestSilentCommandKeepsTheCallAlive: a command that prints nothing for
// a while still gets a progress notification every beat ("running 2s, no
// new output"), each with a higher progress value, and its output when it
// comes.
func TestSilentCommandKeepsTheCallAlive(t *testing.T) {
	type note struct {
		progress float64
		msg      string
	}
	var mu sync.Mutex
	var notes []note
	r := newRigWith(t, nil, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
		mu.Lock()
		notes = append(notes, note{req.Params.Progress, req.Params.Message})
		mu.Unlock()
	}})
	r.d.progressBeat = 300 * time.Millisecond
	r.ok(NameExec, map[string]any{"argv": []string{"true"}}) // the sandbox is up

	res, err := r.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: NameExec,
		Arguments: map[string]any{"command": "sleep 3; echo done"}, Meta: mcp.Meta{"progressToken": "beat"}})
	if err != nil || res.IsError {
		t.Fatalf("exec: %v %v", err, res)
	}
	// Notifications are sent before the result; give the client a moment
	// to have handled the last.
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	beats, output := 0, false
	for i, n := range notes {
		if i > 0 && n.progress <= notes[i-1].progress {
			t.Errorf("progress went from %g to %g", notes[i-1].progress, n.progress)
		}
		switch {
		case regexp.MustCompile(`^running \d+s, no new output$`).MatchString(n.msg):
			beats++
		case n.msg == "stdout: done\n":
			output = true
		default:
			t.Errorf("unexpected notification %q", n.msg)
		}
	}
	if beats < 3 || !output {
		t.Fatalf("%d beats in 3 s of silence at one per 300 ms, output sent: %v; notifications %v", beats, output, notes)
	}
}

// TestOutOfMemoryIsSaid: a command the OOM killer ended gets a hint that
// the sandbox ran out of memory and what its limit is; a command killed
// otherwise does not.
func TestOutOfMemoryIsSaid(t *testing.T) {
	r := newRig(t, nil) // 256 MiB
	// sort keeps a whole line in memory: 1 GiB without a newline.
	out := r.ok(NameExec, map[string]any{"command": "head -c 1073741824 /dev/zero | sort >/dev/null"})
	hint, _ := out["hint"].(string)
	if out["exit_code"] != float64(137) || !strings.Contains(hint, "ran out of memory (limit 256 MiB, workspace files included)") {
		t.Fatalf("the OOM-killed command: exit code %v, hint %q", out["exit_code"], hint)
	}

	out = r.ok(NameExec, map[string]any{"command": "kill -9 $$"})
	if hint, _ := out["hint"].(string); out["exit_code"] != float64(137) || strings.Contains(hint, "memory") {
		t.Fatalf("a command killed by a signal: exit code %v, hint %q", out["exit_code"], hint)
	}

	// A job tells it when it ends.
	job := r.ok(NameExec, map[string]any{"command": "head -c 1073741824 /dev/zero | sort >/dev/null", "background": true})["job"]
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out = r.ok(NameJob, map[string]any{"job": job, "wait_ms": 5000})
		if out["state"] != "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the memory bomb still runs: %v", out)
		}
	}
	if hint, _ := out["hint"].(string); !strings.Contains(hint, "ran out of memory (limit 256 MiB") {
		t.Fatalf("the OOM-killed job: %v", out)
	}
}

// TestCutHintOffersOnlyKeptBytes: when a job keeps less of its output than
// was left out of the result, the hint offers the first byte still kept
// (which sandbox_job then reads from), never one already dropped, and
// says how to handle a long log.
func TestCutHintOffersOnlyKeptBytes(t *testing.T) {
	r := newRig(t, func(p *policy.Policy) { p.MaxOutputBytes, p.MaxJobOutputBytes = 1<<10, 4<<10 })
	out := r.ok(NameExec, map[string]any{"argv": []string{"seq", "1", "100000"}})
	const total = 588895 // bytes of seq 1 100000
	hint := out["hint"].(string)
	m := regexp.MustCompile(`stdout_offset (\d+)`).FindStringSubmatch(hint)
	if m == nil {
		t.Fatalf("the hint offers no offset: %q", hint)
	}
	off, _ := strconv.ParseInt(m[1], 10, 64)
	if off < total-4<<10 {
		t.Fatalf("the hint offers stdout_offset %d, but the job keeps only the bytes from %d: %q", off, total-4<<10, hint)
	}
	if !strings.Contains(hint, "build.log 2>&1") || !strings.Contains(hint, "rg ") || !strings.Contains(hint, "tail ") {
		t.Fatalf("the hint of a long log does not say to send it to a file and search it: %q", hint)
	}
	read := r.ok(NameJob, map[string]any{"job": out["job"], "stdout_offset": off})
	if got := read["stdout"].(string); int64(read["stdout_offset"].(float64))-int64(len(got)) != off || got == "" {
		t.Fatalf("reading from the offered offset %d gave %d bytes ending at %v", off, len(got), read["stdout_offset"])
	}
}
