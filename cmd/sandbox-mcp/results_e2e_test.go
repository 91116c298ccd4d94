package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// bigStderr writes 100 KiB to stderr, then a last line a model needs (the
// error at the end of a build log), and fails.
const bigStderr = `head -c 102400 /dev/zero | tr '\0' e >&2; echo >&2; echo 'error: THE-LAST-LINE' >&2; exit 3`

// TestTextClientsSeeTheOutput: on every protocol version a client may
// ask for, a result's text carries what the model needs: the tail of a
// 100 KiB stderr is in the text of the exec and of the job reads, never a
// pointer to fields a text client does not show; a binary read's text
// carries its base64. A client whose negotiated version predates
// structured content gets the text alone; the others get both copies,
// the same. The negotiated version decides, not the one asked for: 2024-
// 10-07 is no version the server serves, so it negotiates 2025-11-25.
func TestTextClientsSeeTheOutput(t *testing.T) {
	for _, v := range []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05", "2024-10-07"} {
		t.Run(v, func(t *testing.T) {
			s := startServer(t, serverOpts{protocol: v})
			negotiated := s.cs.InitializeResult().ProtocolVersion
			if want := map[string]string{"2024-10-07": "2025-11-25"}[v]; want != "" && negotiated != want || want == "" && negotiated != v {
				t.Fatalf("negotiated %s for %s", negotiated, v)
			}
			textOnly := negotiated < "2025-06-18"
			// Output schemas are listed to the clients that get
			// structured content, and only to them.
			tl, err := s.cs.ListTools(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, tool := range tl.Tools {
				if textOnly && tool.OutputSchema != nil || !textOnly && tool.Name == "sandbox_exec" && tool.OutputSchema == nil {
					t.Errorf("%s: output schema listed: %v, to a %s client", tool.Name, tool.OutputSchema != nil, negotiated)
				}
			}
			check := func(what string, res *mcp.CallToolResult, stderrField string) string {
				t.Helper()
				txt := text(res)
				if strings.Contains(txt, "fields]") || strings.Contains(txt, "in the result's") {
					t.Errorf("%s: the text points at fields: %.300q", what, txt)
				}
				switch sc, _ := res.StructuredContent.(map[string]any); {
				case textOnly && res.StructuredContent != nil:
					t.Errorf("%s: a %s client got structured content it cannot show", what, negotiated)
				case !textOnly && sc == nil:
					t.Errorf("%s: a %s client got no structured content", what, negotiated)
				case !textOnly && stderrField != "":
					if got, _ := sc[stderrField].(string); !strings.Contains(txt, got) {
						t.Errorf("%s: the text lacks the structured %s (%d bytes)", what, stderrField, len(got))
					}
				}
				return txt
			}

			res := s.call("sandbox_exec", map[string]any{"command": bigStderr})
			raw, _ := json.Marshal(res)
			txt := check("exec", res, "stderr")
			t.Logf("%s: the exec's text is %d bytes, its whole result %d bytes of JSON", negotiated, len(txt), len(raw))
			if !strings.Contains(txt, "error: THE-LAST-LINE") || !strings.Contains(txt, "exit code 3") {
				t.Fatalf("the exec's text lacks the stderr's tail: %.500q", txt)
			}
			if strings.Contains(txt, "usually says why") || strings.Contains(txt, "the command failed") {
				t.Errorf("the hint says what stderr already says: %q", txt[strings.LastIndex(txt, "--- hint ---"):])
			}
			m := regexp.MustCompile(`job ([^)\s]+)\)`).FindStringSubmatch(txt)
			if m == nil {
				t.Fatalf("no job id in %.200q", txt)
			}
			job := m[1]
			// The job's reads: from near the end, and what the exec's
			// result left out.
			txt = check("job read", s.call("sandbox_job", map[string]any{"job": job, "stderr_offset": 102400 - 100}), "stderr")
			if !strings.Contains(txt, "error: THE-LAST-LINE") || !strings.Contains(txt, "exit code 3") {
				t.Fatalf("the job's text lacks the stderr's tail: %.500q", txt)
			}
			txt = check("job read from 40000", s.call("sandbox_job", map[string]any{"job": job, "stderr_offset": 40000}), "stderr")
			if strings.Count(txt, "e") < 20000 {
				t.Errorf("a job read's text lacks its output: %d bytes", len(txt))
			}

			// A background job followed to its end.
			txt = check("background", s.call("sandbox_exec", map[string]any{"command": bigStderr, "background": true}), "")
			m = regexp.MustCompile(`job (\S+) started`).FindStringSubmatch(txt)
			if m == nil {
				t.Fatalf("no job id in %q", txt)
			}
			var all strings.Builder
			for i := 0; i < 20 && !strings.Contains(all.String(), "THE-LAST-LINE"); i++ {
				all.WriteString(check("background read", s.call("sandbox_job", map[string]any{"job": m[1], "wait_ms": 5000}), "stderr"))
			}
			if !strings.Contains(all.String(), "error: THE-LAST-LINE") {
				t.Fatalf("the background job's texts never carried the stderr's tail")
			}

			// A binary read carries its bytes, as base64, in the text.
			bin := []byte("\x00\x01binary\xff\xfe")
			check("write", s.call("sandbox_write_file", map[string]any{"path": "b.bin", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"}), "")
			txt = check("binary read", s.call("sandbox_read_file", map[string]any{"path": "b.bin"}), "content")
			if !strings.Contains(txt, base64.StdEncoding.EncodeToString(bin)) {
				t.Fatalf("the binary read's text lacks its base64: %q", txt)
			}
		})
	}
}

// copts asks for protocol version ("": the SDK's).
func copts(version string) *mcp.ClientSessionOptions {
	if version == "" {
		return nil
	}
	return &mcp.ClientSessionOptions{ProtocolVersion: version}
}

// TestHTTPTextClientsSeeTheOutput: over HTTP too, a text client (one that
// negotiated 2025-03-26) gets the tail of a long stderr in the text and no
// structured copy, and a structured client gets both.
func TestHTTPTextClientsSeeTheOutput(t *testing.T) {
	h := startHTTP(t, httpOpts{})
	for _, v := range []string{"2025-03-26", "2025-11-25"} {
		c, err := h.tryConnectAt("", v)
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		res := c.call("sandbox_exec", map[string]any{"command": bigStderr})
		if txt := text(res); !strings.Contains(txt, "error: THE-LAST-LINE") || strings.Contains(txt, "fields]") {
			t.Errorf("%s: the text lacks the stderr's tail: %.300q", v, txt)
		}
		if (res.StructuredContent == nil) != (v == "2025-03-26") {
			t.Errorf("%s: structured content %T", v, res.StructuredContent)
		}
	}
}

// TestSnapshotsFoundAgain: a model finds its snapshots through a tool, as
// a structured and as a text client; sandbox_restore takes an id, a label
// of one snapshot, or latest; a label two snapshots share is refused with
// their ids, an unknown one points at the list.
func TestSnapshotsFoundAgain(t *testing.T) {
	for _, v := range []string{"2025-11-25", "2025-03-26"} {
		t.Run(v, func(t *testing.T) {
			s := startServer(t, serverOpts{protocol: v})
			textOnly := v < "2025-06-18"
			call := func(name string, args map[string]any) string {
				t.Helper()
				res := s.call(name, args)
				if res.IsError {
					t.Fatalf("%s(%v): %s", name, args, text(res))
				}
				return text(res)
			}
			if txt := call("sandbox_snapshot", map[string]any{"list": true}); !strings.Contains(txt, "no snapshots") {
				t.Fatalf("empty list: %q", txt)
			}
			call("sandbox_write_file", map[string]any{"path": "state.txt", "content": "one"})
			first := call("sandbox_snapshot", map[string]any{"label": "before the refactor"})
			call("sandbox_write_file", map[string]any{"path": "state.txt", "content": "two"})
			call("sandbox_snapshot", map[string]any{"label": "twice"})
			call("sandbox_snapshot", map[string]any{"label": "twice"})
			call("sandbox_write_file", map[string]any{"path": "state.txt", "content": "three"})

			res := s.call("sandbox_snapshot", map[string]any{"list": true})
			list := text(res)
			ids := regexp.MustCompile(`(?m)^(snap-[0-9a-f]+) `).FindAllStringSubmatch(list, -1)
			if len(ids) != 3 || !strings.Contains(list, `label "before the refactor"`) || !strings.Contains(first, ids[2][1]) {
				t.Fatalf("list (newest first) %q; first snapshot %q", list, first)
			}
			if !textOnly {
				snaps, _ := res.StructuredContent.(map[string]any)["snapshots"].([]any)
				if len(snaps) != 3 || snaps[2].(map[string]any)["label"] != "before the refactor" {
					t.Fatalf("structured list: %v", res.StructuredContent)
				}
			}
			read := func() string {
				return strings.SplitN(call("sandbox_read_file", map[string]any{"path": "state.txt"}), "\n", 2)[1]
			}
			call("sandbox_restore", map[string]any{"id": "before the refactor"})
			if got := read(); got != "one" {
				t.Fatalf("restored by label: %q", got)
			}
			call("sandbox_restore", map[string]any{"id": "latest"})
			if got := read(); got != "two" {
				t.Fatalf("restored latest: %q", got)
			}
			msg := s.fails("sandbox_restore", map[string]any{"id": "twice"}, "INVALID_ARGUMENT")
			if !strings.Contains(msg, ids[0][1]) || !strings.Contains(msg, ids[1][1]) {
				t.Errorf("a shared label: %q", msg)
			}
			for _, id := range []string{"no such label", "snap-00000000000000000000"} {
				if msg := s.fails("sandbox_restore", map[string]any{"id": id}, "NOT_FOUND"); !strings.Contains(msg, "sandbox_snapshot with list: true") || strings.Contains(msg, "resources/list") {
					t.Errorf("%s: %q", id, msg)
				}
			}
			call("sandbox_snapshot_delete", map[string]any{"id": ids[0][1]})
			if msg := s.fails("sandbox_snapshot_delete", map[string]any{"id": ids[0][1]}, "NOT_FOUND"); !strings.Contains(msg, "list: true") {
				t.Errorf("deleting twice: %q", msg)
			}
		})
	}
}

// TestHabitsGetTheRightName: the arguments other agents' tools take get a
// sentence naming this server's, through a real client on the real engine;
// the harmless ones are taken; a ~ path says where the workspace is.
func TestHabitsGetTheRightName(t *testing.T) {
	s := startServer(t, serverOpts{})
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"sandbox_exec", map[string]any{"command": "sleep 1", "timeout": 5}, "timeout_ms"},
		{"sandbox_exec", map[string]any{"command": "ls", "workdir": "src"}, "cwd is the working directory"},
		{"sandbox_exec", map[string]any{"cmd": "ls"}, "command is a shell line"},
		{"sandbox_exec", map[string]any{"command": []string{"ls", "-la"}}, "use argv"},
		{"sandbox_read_file", map[string]any{"file_path": "a.txt"}, "path is the file's path"},
		{"sandbox_write_file", map[string]any{"file_path": "a.txt", "content": "x"}, "path is the file's path"},
		{"sandbox_read_file", map[string]any{"path": "~/a.txt"}, "the workspace is /workspace"},
		{"sandbox_exec", map[string]any{"argv": []string{"ls"}, "cwd": "~"}, "the workspace is /workspace"},
	} {
		if msg := s.fails(tc.tool, tc.args, "INVALID_ARGUMENT"); !strings.Contains(msg, tc.want) {
			t.Errorf("%s %v: %q lacks %q", tc.tool, tc.args, msg, tc.want)
		}
	}
	out := s.ok("sandbox_exec", map[string]any{"command": "echo hi", "description": "say hi"})
	if out["stdout"] != "hi\n" {
		t.Errorf("with a description: %v", out)
	}
	// (s.ok would follow a running job to its end.)
	res := s.call("sandbox_exec", map[string]any{"command": "sleep 30", "run_in_background": true})
	out, _ = res.StructuredContent.(map[string]any)
	if res.IsError || out["running"] != true || !strings.Contains(text(res), "started in the background") {
		t.Fatalf("run_in_background: %v %q", out, text(res))
	}
	s.ok("sandbox_job", map[string]any{"job": out["job"], "signal": "KILL"})
	// A failure that says nothing on stderr keeps the sentence about it.
	if out := s.ok("sandbox_exec", map[string]any{"command": "exit 1"}); !strings.Contains(fmt.Sprint(out["hint"]), "exit code 1: the command failed") {
		t.Errorf("a silent failure: %v", out["hint"])
	}
}

// TestAllowlistWithoutAShellSaysArgvOnly: under --exec=allowlist without
// a shell, the instructions and sandbox_exec's description say shell lines
// are refused, and one is.
func TestAllowlistWithoutAShellSaysArgvOnly(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--exec", "allowlist", "--allow-cmd", "ls,cat"}})
	if in := s.cs.InitializeResult().Instructions; !strings.Contains(in, "argv only; shell lines are refused here") {
		t.Errorf("instructions: %q", in)
	}
	res, err := s.cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range res.Tools {
		if tool.Name == "sandbox_exec" && !strings.Contains(tool.Description, "argv only; shell lines (command) are refused here") {
			t.Errorf("exec description: %q", tool.Description)
		}
	}
	s.fails("sandbox_exec", map[string]any{"command": "ls"}, "POLICY_DENIED")
	s.ok("sandbox_exec", map[string]any{"argv": []string{"ls"}})
}
