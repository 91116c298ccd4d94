package agentproto

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the JSON golden files in testdata/ from the messages")

// samples holds one value of every message that travels in a frame body or
// payload, every field set, so that each field's JSON name is in its golden
// file: a renamed or dropped field changes the file instead of silently
// reading as zero ("no limit", "no timeout") on a peer that still uses the
// old name.
var samples = map[string]any{
	"hello": Hello{
		Version: Version, Agent: "sandbox-agent v1.2.3", PID: 7, UID: 1000, Workspace: "/workspace",
		UIDs: [3]int{0, 1000, 0}, GIDs: [3]int{0, 1000, 0}, CommandUID: 1000, CommandGID: 1000,
		CommandGroups: [2]uint32{2_000_000_000, 1 << 30},
	},
	"lease":  Lease{TTLMillis: 60_000, Token: "5f0c2a9e7b1d4c3a8e6f0b2d4c6a8e0f5f0c2a9e7b1d4c3a8e6f0b2d4c6a8e0f"},
	"resume": Resume{Nonce: "9d2f4b6a8c0e1f3a"},
	"resumed": Resumed{
		Hello: Hello{
			Version: Version, Agent: "sandbox-agent v1.2.3", PID: 7, UID: 1000, Workspace: "/workspace",
			UIDs: [3]int{0, 1000, 0}, GIDs: [3]int{0, 1000, 0}, CommandUID: 1000, CommandGID: 1000,
			CommandGroups: [2]uint32{2_000_000_000, 1 << 30},
		},
		Jobs:        []JobStatus{{Job: 4, Label: "sleep 9", State: JobRunning}},
		LeaseMillis: 60_000, Detached: 1, Cancelled: 2,
	},
	"setup_request": SetupRequest{CACerts: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", Env: []string{"HTTPS_PROXY=http://sbx:TOKEN@10.0.0.1:3128"}},
	"setup_result":  SetupResult{CABundle: CABundlePath, SystemRoots: "/etc/ssl/certs/ca-certificates.crt", Env: 1},
	"exec_request": ExecRequest{
		Path: "/bin/ls", Argv: []string{"ls", "-l"}, Cwd: "src", Env: []string{"A=1"},
		TimeoutMillis: 60_000, MaxOutput: 32 << 10, Stdin: true,
		Job: 4, Label: "ls -l", Background: true, KeepOutput: 1 << 20, MaxJobs: 8,
	},
	"job_request": JobRequest{
		Job: 4, Stdin: []byte("hi\n"), CloseStdin: true, Signal: "TERM", WaitMillis: 1000,
		StdoutOffset: -1, StderrOffset: 100, Max: 32 << 10, Peek: true,
	},
	"job_status": JobStatus{
		Job: 4, Label: "ls -l", State: JobKilled, ExitCode: 143, Signal: "SIGTERM", TimedOut: true,
		StartedUnixMilli: 1_796_000_000_000, StdoutFrom: 10, StderrFrom: 20, StdoutBytes: 2000, StderrBytes: 30,
		StdoutDropped: 5, StderrDropped: 6, Killed: 2, OOMKills: 1,
	},
	"jobs_request": JobsRequest{},
	"job_list":     JobList{Jobs: []JobStatus{{Job: 4, Label: "sleep 9", State: JobRunning}}},
	"exec_result": ExecResult{
		ExitCode: 137, Signal: "KILL", TimedOut: true, Cancelled: true, StdoutBytes: 10, StderrBytes: 20,
		Killed: 3, DurationNano: 1_500_000, PipesHeld: true, OOMKills: 1,
	},
	"read_request": ReadRequest{Path: "a.txt", Offset: 10, Length: 100, Max: 8 << 20, StartLine: 3, EndLine: 9,
		MaxScan: 8 << 20, MaxLineChars: 2000},
	"read_result": ReadResult{Size: 1000, Truncated: true, Offset: 120, End: 900, StartLine: 3, EndLine: 9, TotalLines: 40,
		Scanned: 1000, Cuts: []LineCut{{Line: 4, Offset: 2300, Rest: 500}}},
	"edit_request": EditRequest{Path: "a.txt", OldSize: 3, NewSize: 4, ReplaceAll: true, MaxFile: 8 << 20,
		Edits: []EditSpec{{OldSize: 3, NewSize: 4, ReplaceAll: true}}},
	"edit_result":    EditResult{Replacements: 2, Size: 26, Created: true},
	"delete_request": DeleteRequest{Path: "build", Recursive: true},
	"delete_result":  DeleteResult{Deleted: 12, Type: TypeDir},
	"move_request":   MoveRequest{From: "a.txt", To: "src/", Overwrite: true},
	"move_result":    MoveResult{To: "src/a.txt", Type: TypeFile},
	"write_request":  WriteRequest{Path: "a.txt", Append: true, Mode: 0o644, Size: 12},
	"write_result":   WriteResult{Written: 12, Size: 24},
	"list_request": ListRequest{Path: "src", Recursive: true, Max: 1000, Pattern: "**/*.py",
		Prune: []string{"node_modules", ".git"}, MaxScan: 100_000},
	"list_entry": Entry{
		Path: "src/link", Type: TypeSymlink, Size: 3, Mode: 0o777,
		MTime: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), Target: "../a.txt",
		Pruned: true, Count: 12,
	},
	"list_result":       ListResult{Count: 2, Truncated: true, Scanned: 40},
	"resolve_request":   ResolveRequest{Names: []string{"ls", "./run.sh"}, Cwd: "."},
	"resolve_result":    ResolveResult{Paths: []string{"/bin/ls", ""}},
	"snapshot_request":  SnapshotRequest{Limits: Limits{MaxBytes: 512 << 20, MaxEntries: 100_000, MaxDepth: 64}},
	"snapshot_result":   SnapshotResult{Files: 5, Bytes: 10240, Skipped: 1},
	"restore_request":   RestoreRequest{Limits: Limits{MaxBytes: 512 << 20, MaxEntries: 100_000, MaxDepth: 64}},
	"restore_result":    RestoreResult{Files: 5, Bytes: 10240, Skipped: 1},
	"port_open_request": PortOpenRequest{Port: 8000, DialTimeoutMillis: 5000},
	"port_ack":          PortAck{Bytes: 65536},
	"port_result":       PortResult{ToPort: 120, FromPort: 4096, Reset: true},
	"error":             Error{Code: "NOT_FOUND", Message: `"a.txt" does not exist`},
	"header":            Header{ID: 3, Kind: KindRead, TimeoutMillis: 60_000, Body: json.RawMessage(`{"path":"a"}`)},
	// The kinds are the wire's vocabulary too.
	"kinds": []Kind{
		KindHello, KindLease, KindPing, KindPong, KindResume, KindResumed, KindExec, KindStdout, KindStderr, KindExit,
		KindJob, KindJobs, KindRead, KindWrite, KindEdit, KindDelete, KindMove, KindList, KindResolve, KindSnapshot, KindRestore, KindSetup,
		KindData, KindEOF, KindCancel, KindDetach, KindResult, KindError,
		KindPortOpen, KindPortReady, KindPortData, KindPortAck, KindPortClose,
	},
}

// TestMessagesMatchTheirGoldenJSON: every message encodes exactly as its
// file in testdata/ says, and the file decodes back to the same message. A
// change to the wire shows in review as a change to a golden file (run
// `go test ./agentproto -run TestMessagesMatch -update`), and one that an old
// peer would misread also needs a new Version (see its history).
func TestMessagesMatchTheirGoldenJSON(t *testing.T) {
	for name, v := range samples {
		t.Run(name, func(t *testing.T) {
			if zero := zeroFields(reflect.ValueOf(v), name); len(zero) > 0 {
				t.Fatalf("the sample leaves %v unset: give every field a value, so its name is pinned", zero)
			}
			got, err := json.MarshalIndent(v, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", name+".golden.json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to write it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s encodes as\n%s\nbut %s holds\n%s\nIf the change is meant, run with -update; if a peer of the last Version would misread it, bump Version and say why in its history", name, got, path, want)
			}
			// Decoding the file and encoding again gives the file: every
			// name in it is one the type reads.
			back := reflect.New(reflect.TypeOf(v))
			if err := json.Unmarshal(want, back.Interface()); err != nil {
				t.Fatal(err)
			}
			again, err := json.MarshalIndent(back.Elem().Interface(), "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(append(again, '\n'), want) {
				t.Fatalf("%s decodes and encodes again as\n%s", path, again)
			}
		})
	}
}

// zeroFields names the fields of v, at any depth, that hold their zero
// value.
func zeroFields(v reflect.Value, path string) []string {
	if v.Type() == reflect.TypeFor[time.Time]() {
		if v.IsZero() {
			return []string{path}
		}
		return nil
	}
	switch v.Kind() {
	case reflect.Struct:
		var out []string
		for i := range v.NumField() {
			out = append(out, zeroFields(v.Field(i), path+"."+v.Type().Field(i).Name)...)
		}
		return out
	case reflect.Slice, reflect.Array:
		if v.Len() == 0 {
			return []string{path}
		}
		return nil
	}
	if v.IsZero() {
		return []string{path}
	}
	return nil
}
