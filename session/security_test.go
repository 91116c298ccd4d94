package session

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// The container cases of docs/attack-cases.md, run in a real sandbox.

func TestSecurityForkBomb(t *testing.T) {
	m := testManager(t, func(o *Options) { o.Policy.Pids = 64 })
	sb := newSandbox(t, m)
	other, _ := m.Sandbox("other", "")
	run(t, other, "true")

	done := execStarted(t, context.Background(), sb, ExecRequest{Argv: []string{"sh", "-c", "bomb() { bomb | bomb & }; bomb; echo started; sleep 60"}, Timeout: 3 * time.Second, MaxOutput: 4096})
	// Another sandbox answers while the bomb runs.
	start := time.Now()
	run(t, other, "true")
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("another sandbox took %s to answer during a fork bomb", d)
	}
	res := (<-done).res
	if !res.TimedOut {
		t.Fatalf("fork bomb: %+v", res)
	}
	// The bomb is gone: the only shell left is the one asking.
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := string(sh(t, sb, "ps -o comm | grep -c '^sh$'").Stdout)
		if strings.TrimSpace(out) == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left after the fork bomb:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestSecurityMemoryBomb(t *testing.T) {
	m := testManager(t, nil) // 256 MiB
	sb := newSandbox(t, m)
	// sort keeps a whole line in memory: 1 GiB without a newline.
	res := sh(t, sb, "head -c 1073741824 /dev/zero | sort >/dev/null; echo status=$?")
	if !strings.Contains(string(res.Stdout), "status=137") {
		t.Fatalf("want the OOM killer's 137: %q %q", res.Stdout, res.Stderr)
	}
	run(t, sb, "true") // the sandbox lives on
}

func TestSecurityDiskFill(t *testing.T) {
	m := testManager(t, func(o *Options) { o.Policy.MaxWorkspaceBytes = 16 << 20 })
	sb := newSandbox(t, m)
	res := sh(t, sb, "dd if=/dev/zero of=/workspace/fill bs=1M count=64 2>&1; echo status=$?")
	if !strings.Contains(string(res.Stdout), "No space left on device") {
		t.Fatalf("want ENOSPC at the tmpfs size: %q", res.Stdout)
	}
	if r := run(t, sb, "echo", "still-alive"); string(r.Stdout) != "still-alive\n" {
		t.Fatal(r)
	}
	_, err := sb.WriteFile(context.Background(), "more", make([]byte, 1<<20), false, 0o644)
	wantCode(t, err, errcode.TooLarge)
}

func TestSecurityNoWayOut(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	for _, script := range []string{
		// container case 4: outside the workspace
		"touch /x", "echo x > /etc/passwd", "touch /bin/x", "mkdir /opt",
		// case 11: privileged operations
		"mount -t tmpfs x /tmp", "unshare -n true", "unshare -U true", "nsenter -t 1 -m true", "chroot / true",
		"mknod /workspace/d c 1 3", "ip link add d0 type dummy", "chown 0 /workspace",
		"date -s 2000-01-01 >/dev/null 2>&1; test $(date +%Y) = 2000",
		"sysctl -w kernel.hostname=x", "hostname evil", "ping -c 1 -W 1 127.0.0.1",
		// case 13: /proc and /sys
		"head -c 1 /proc/kcore", "echo x > /proc/sys/kernel/core_pattern", "echo b > /proc/sysrq-trigger",
		"echo 1 > /sys/fs/cgroup/pids/pids.max || echo 1 > /sys/fs/cgroup/pids.max",
		// case 10: no Docker socket
		"test -e /var/run/docker.sock || test -e /run/docker.sock",
	} {
		res := sh(t, sb, script)
		if res.ExitCode == 0 {
			t.Errorf("%q succeeded:\n%s%s", script, res.Stdout, res.Stderr)
		}
	}
	// Case 12: a setuid copy grants nothing.
	res := sh(t, sb, "mkdir -p /workspace/s && cp /bin/busybox /workspace/s/busybox && chmod u+s /workspace/s/busybox && /workspace/s/busybox id -u")
	if strings.TrimSpace(string(res.Stdout)) != "1000" {
		t.Errorf("setuid binary: %q %q", res.Stdout, res.Stderr)
	}
	// Cases 15 and 18.
	if got := strings.TrimSpace(string(sh(t, sb, "id -u; ulimit -n").Stdout)); got != "1000\n4096" {
		t.Errorf("id and ulimit: %q", got)
	}
	// Case 19: nothing of the docker socket or the server in the environment.
	if env := string(run(t, sb, "env").Stdout); strings.Contains(strings.ToLower(env), "docker") || strings.Contains(env, "SANDBOX_MCP_TOKEN") {
		t.Errorf("environment: %s", env)
	}
}

func TestSecurityCPULimit(t *testing.T) {
	m := testManager(t, func(o *Options) { o.Policy.CPUs = 0.5 })
	sb := newSandbox(t, m)
	// The engine turns --cpus into a CFS quota of the container's cgroup:
	// half of each period here. Throttling itself shows only when the
	// machine has a spare core for the loop, so the quota is what is
	// checked; a loaded machine cannot make this pass or fail by chance.
	res, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c",
		"cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null || cat /sys/fs/cgroup/cpu.max"},
		Cwd: ".", Timeout: 20 * time.Second, MaxOutput: 4096})
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(res.Stdout))
	if len(f) != 2 {
		t.Fatalf("cannot read the container's CPU quota: %q (stderr %q)", res.Stdout, res.Stderr)
	}
	quota, err1 := strconv.Atoi(f[0])
	period, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || period <= 0 {
		t.Fatalf("CPU quota %q is not a limit", res.Stdout)
	}
	if got := float64(quota) / float64(period); got < 0.49 || got > 0.51 {
		t.Fatalf("CPU quota is %d/%d = %.2f CPUs, want 0.5", quota, period, got)
	}
}

// TestSecuritySymlinkSwap races file calls against a loop inside the sandbox
// that keeps swapping a directory with a symlink to /tmp (path case 10 of
// docs/attack-cases.md): no read returns the outside file, no write lands
// outside.
func TestSecuritySymlinkSwap(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	ctx := context.Background()
	sh(t, sb, "echo SECRET > /tmp/secret; mkdir d; echo inside > d/secret")
	swapper := execStarted(t, ctx, sb, ExecRequest{Argv: []string{"sh", "-c",
		"echo started; while :; do mv d d.real; ln -s /tmp d; rm d; mv d.real d; done"}, Timeout: 6 * time.Second})
	var wg sync.WaitGroup
	var mu sync.Mutex
	reads, writes, inside := 0, 0, 0
	deadline := time.Now().Add(4 * time.Second)
	for w := range 2 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				res, err := sb.ReadFile(ctx, "d/secret", 0, 0, 1024)
				mu.Lock()
				reads++
				if err == nil {
					if strings.Contains(string(res.Data), "SECRET") {
						mu.Unlock()
						t.Errorf("read /tmp/secret through the swapped symlink")
						return
					}
					inside++
				}
				mu.Unlock()
				_, _ = sb.WriteFile(ctx, "d/x"+strconv.Itoa(w), []byte("x"), false, 0o644)
				mu.Lock()
				writes++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	<-swapper
	if res := sh(t, sb, "ls /tmp"); strings.Contains(string(res.Stdout), "x0") || strings.Contains(string(res.Stdout), "x1") {
		t.Fatalf("a write landed outside the workspace: %q", res.Stdout)
	}
	t.Logf("%d reads (%d inside), %d writes while swapping", reads, inside, writes)
	if reads < 100 {
		t.Fatalf("only %d reads: the race was not exercised", reads)
	}
}

// installIntruder copies the intruder program (see internal/intruder) to
// /tmp/intruder in sb, outside the workspace.
func installIntruder(t *testing.T, sb *Sandbox) {
	t.Helper()
	bin, err := os.ReadFile(intruderBin(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.WriteFile(context.Background(), "intruder", bin, false, 0o755); err != nil {
		t.Fatal(err)
	}
	if res := sh(t, sb, "mv /workspace/intruder /tmp/intruder"); res.ExitCode != 0 {
		t.Fatalf("install the intruder: %s", res.Stderr)
	}
}

// TestSandboxCannotReachTheStream: code run by an exec can neither open the
// file descriptors of PID 1 and of the agent (which hold the protocol
// stream), nor read their memory or environment, nor trace or signal them.
func TestSandboxCannotReachTheStream(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	installIntruder(t, sb)
	res := run(t, sb, "/tmp/intruder", "probe")
	out := strings.TrimSpace(string(res.Stdout))
	lines := strings.Split(out, "\n")
	if res.ExitCode != 0 || len(lines) != 1+2*10 {
		t.Fatalf("probe exited %d:\n%s\n%s", res.ExitCode, out, res.Stderr)
	}
	for _, line := range lines[1:] {
		what, outcome, _ := strings.Cut(line, ": ")
		want := "EACCES" // /proc files: ptrace access mode checks
		if strings.HasPrefix(what, "ptrace") || strings.HasPrefix(what, "signal") {
			want = "EPERM"
		}
		if outcome != want {
			t.Errorf("%s: %s, want %s", what, outcome, want)
		}
	}
	// The agent was not stopped, killed or disturbed.
	if r := run(t, sb, "echo", "alive"); string(r.Stdout) != "alive\n" {
		t.Fatalf("after the probe: %q", r.Stdout)
	}
}

// TestImpersonationChangesNoResult runs code in the sandbox that keeps trying
// to stop the agent, open the protocol stream through /proc and answer the
// server with forged frames, while the test makes exec, read, write, list,
// resolve and snapshot calls: every result is what the workspace holds.
func TestImpersonationChangesNoResult(t *testing.T) {
	m := testManager(t, func(o *Options) {
		o.Policy.Exec = policy.ExecAllowlist
		o.Policy.AllowCmds = []string{"sh", "cat", "mv", "echo"}
	})
	sb := newSandbox(t, m)
	installIntruder(t, sb)
	call := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 20*time.Second)
	}
	want := map[string]string{"a.txt": "alpha\n", "d/b.txt": "beta\n"}
	for name, content := range want {
		ctx, cancel := call()
		_, err := sb.WriteFile(ctx, name, []byte(content), false, 0o644)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	names := []string{"sh", "cat", "mv"}
	ctx, cancel := call()
	resolved, err := sb.Resolve(ctx, names, ".")
	cancel()
	if err != nil || slices.Contains(resolved, "") {
		t.Fatalf("resolve before the attack: %q %v", resolved, err)
	}

	const attackSecs = 8
	// The intruder runs beside the calls below; the shell that started it
	// waits for it, so the call ends when the attack does.
	attack := execStarted(t, context.Background(), sb, ExecRequest{Argv: []string{"sh", "-c",
		fmt.Sprintf("/tmp/intruder impersonate %d /tmp/intruder.log >/dev/null 2>&1 & echo started; wait", attackSecs)},
		Timeout: 2 * attackSecs * time.Second})
	deadline := time.Now().Add(attackSecs*time.Second - time.Second)
	calls := 0
	for i := 0; time.Now().Before(deadline); i++ {
		ctx, cancel := call()
		res, err := sb.Exec(ctx, ExecRequest{Argv: []string{"cat", "a.txt"}, Cwd: ".", Timeout: 10 * time.Second, MaxOutput: 1 << 10})
		if err != nil || res.ExitCode != 0 || string(res.Stdout) != "alpha\n" {
			t.Fatalf("exec %d: %q exit %d, %v", i, res.Stdout, res.ExitCode, err)
		}
		r, err := sb.ReadFile(ctx, "d/b.txt", 0, 0, 1<<10)
		if err != nil || string(r.Data) != "beta\n" || r.Size != 5 {
			t.Fatalf("read %d: %q size %d, %v", i, r.Data, r.Size, err)
		}
		name, content := fmt.Sprintf("w/%d.txt", i), fmt.Sprintf("written %d\n", i)
		w, err := sb.WriteFile(ctx, name, []byte(content), false, 0o644)
		if err != nil || w.Written != int64(len(content)) {
			t.Fatalf("write %d: %+v %v", i, w, err)
		}
		want[name] = content
		entries, _, err := listed(sb.List(ctx, ".", ListOptions{Recursive: true, MaxEntries: 1000}))
		if err != nil {
			t.Fatalf("list %d: %v", i, err)
		}
		checkListing(t, entries, want)
		paths, err := sb.Resolve(ctx, names, ".")
		if err != nil || !slices.Equal(paths, resolved) {
			t.Fatalf("resolve %d: %q, want %q (%v)", i, paths, resolved, err)
		}
		if i%4 == 0 {
			info, err := sb.Snapshot(ctx, "")
			if err != nil {
				t.Fatalf("snapshot %d: %v", i, err)
			}
			checkSnapshot(t, m, info.ID, want)
		}
		cancel()
		calls++
	}
	// What the intruder tried, and that none of it worked.
	<-attack
	log := string(run(t, sb, "cat", "/tmp/intruder.log").Stdout)
	t.Logf("%d rounds of calls; the intruder's attempts:\n%s", calls, log)
	counts := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		k, v, _ := strings.Cut(line, " ")
		counts[k], _ = strconv.Atoi(v)
	}
	if counts["rounds"] < 100 || counts["stop-EPERM"] < 100 || counts["open-stdin-EACCES"] < 100 || counts["open-stdout-EACCES"] < 100 {
		t.Errorf("the intruder did not keep trying: %v", counts)
	}
	for k, n := range counts {
		if strings.HasSuffix(k, "-ok") || k == "hijacked" {
			t.Errorf("the intruder succeeded: %s %d", k, n)
		}
	}
	if calls < 5 {
		t.Errorf("only %d rounds of calls during the attack", calls)
	}
}

// checkListing compares a recursive listing with the files the test wrote.
func checkListing(t *testing.T, entries []Entry, files map[string]string) {
	t.Helper()
	got := map[string]int64{}
	for _, e := range entries {
		if e.Type == "file" {
			got[e.Path] = e.Size
		}
	}
	if len(got) != len(files) {
		t.Fatalf("list: %d files %v, want %d", len(got), got, len(files))
	}
	for name, content := range files {
		if got[name] != int64(len(content)) {
			t.Fatalf("list: %s has size %d, want %d", name, got[name], len(content))
		}
	}
}

// checkSnapshot compares a stored snapshot with the files the test wrote.
func checkSnapshot(t *testing.T, m *Manager, id string, files map[string]string) {
	t.Helper()
	_, f, err := m.Snapshots().Open(id)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("snapshot %s: %v", id, err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
		case tar.TypeReg:
			b, _ := io.ReadAll(tr)
			got[strings.TrimPrefix(h.Name, "./")] = string(b)
		default:
			t.Fatalf("snapshot %s holds %q of type %c", id, h.Name, h.Typeflag)
		}
	}
	if !maps.Equal(got, files) {
		t.Fatalf("snapshot %s holds %q, want %q", id, got, files)
	}
}

// TestExecTimeoutKillsHiddenProcesses: a process that leaves the command's
// process group and session, clears its dumpable flag (so its environment
// cannot be read) and, in one case, empties its environment, after its
// parent exited, is still killed when the command times out.
func TestExecTimeoutKillsHiddenProcesses(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	installIntruder(t, sb)
	res, err := sb.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c",
		"/tmp/intruder hide; /tmp/intruder hide -clearenv; echo hidden; sleep 100"},
		Cwd: ".", Timeout: 2 * time.Second, MaxOutput: 1 << 10})
	if err != nil || !res.TimedOut {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if lines := strings.Fields(string(res.Stdout)); len(lines) != 3 || lines[2] != "hidden" {
		t.Fatalf("the command did not hide two processes: %q %q", res.Stdout, res.Stderr)
	}
	if res.Killed < 3 {
		t.Errorf("killed %d processes, want the command (sh, which runs sleep in its place) and the two hidden ones", res.Killed)
	}
	// No process of the sandbox user is left but the one asking.
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := strings.TrimSpace(string(run(t, sb, "/tmp/intruder", "procs", "1000").Stdout))
		if left == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes survived the timeout:\n%s", left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// execKillingAgent runs a command in sb and, while it runs, kills the agent
// from outside the sandbox: an engine exec as root, as an operator or a
// crash would (the sandboxed code cannot, see
// TestSandboxCannotReachTheStream). It returns the command's error.
func execKillingAgent(t *testing.T, m *Manager, sb *Sandbox) error {
	t.Helper()
	ctx := context.Background()
	run(t, sb, "true") // a container, with its agent, is up
	sb.mu.Lock()
	inst := sb.cur
	sb.mu.Unlock()
	done := execStarted(t, ctx, sb, ExecRequest{Argv: []string{"sh", "-c", "echo started; exec sleep 5"}, Timeout: 20 * time.Second})
	ex, err := testenv.Engine(t).ExecCreate(ctx, inst.box.Name(), client.ExecCreateOptions{
		User: "0:0", Cmd: []string{"kill", "-9", strconv.Itoa(inst.conn.Hello().PID)},
	})
	if err != nil {
		t.Fatalf("kill the agent: %v", err)
	}
	if _, err := testenv.Engine(t).ExecStart(ctx, ex.ID, client.ExecStartOptions{Detach: true}); err != nil {
		t.Fatalf("kill the agent: %v", err)
	}
	return (<-done).err
}
