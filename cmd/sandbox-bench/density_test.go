package main

import (
	"strings"
	"testing"
)

func TestParseDensity(t *testing.T) {
	got, err := parseDensity(" 500,100, 1_000,100,")
	if err != nil || len(got) != 3 || got[0] != 100 || got[1] != 500 || got[2] != 1000 {
		t.Errorf("parseDensity = %v, %v; want [100 500 1000]", got, err)
	}
	for _, bad := range []string{"", ",", "0", "-5", "ten", "20,x"} {
		if _, err := parseDensity(bad); err == nil {
			t.Errorf("parseDensity(%q) took it", bad)
		}
	}
}

// TestAtN: "the time to create one at N" is the last tenth of the creates
// (at least 5), not all of them.
func TestAtN(t *testing.T) {
	s := make([]float64, 100)
	for i := range s {
		s[i] = float64(i)
	}
	if got := atN(s); len(got) != 10 || got[0] != 90 {
		t.Errorf("atN of 100 = %v", got)
	}
	if got := atN(s[:20]); len(got) != 5 || got[0] != 15 {
		t.Errorf("atN of 20 = %v", got)
	}
	if got := atN(s[:3]); len(got) != 3 {
		t.Errorf("atN of 3 = %v", got)
	}
}

// TestPerIdle: the growth over the baseline, per sandbox, each part.
func TestPerIdle(t *testing.T) {
	base := memSample{Server: 50 << 20, Dockerd: 80 << 20, Containerd: 40 << 20, HostUsed: 2 << 30, Tasks: 200}
	at := memSample{Server: 60 << 20, Dockerd: 100 << 20, Containerd: 40 << 20, Shims: 300 << 20, Overlay: 80 << 20, Containers: 400 << 20, HostUsed: 3 << 30, Tasks: 2200}
	p := perIdle(base, at, 100)
	if p.Server != 0.1 || p.Engine != 4 || p.Containers != 4 || p.Total != 8.1 || p.Host != 10.24 || p.Tasks != 20 {
		t.Errorf("perIdle = %+v", p)
	}
	if p := perIdle(base, at, 0); p != (perSandbox{}) {
		t.Errorf("perIdle at 0 = %+v", p)
	}
}

// TestDensityRow: met only with p99 within the goal, no failed create, a
// thousand fitting in 24 GiB and the count reached.
func TestDensityRow(t *testing.T) {
	fast := []float64{3, 4, 5, 6, 20}
	ok := densityResult{N: 100, Aim: 100, Per: perSandbox{Total: 10}, Create: []float64{300}, Warm: fast}
	if r := densityRow(ok); !r.Met || !strings.Contains(r.Value, "p99 20.0 ms") || !strings.Contains(r.Measure, "100 held") || r.Ratio != 0 {
		t.Errorf("a good count: %+v", r)
	}
	ok.One = []float64{2, 3, 10}
	if r := densityRow(ok); r.Ratio != 2 || !strings.Contains(r.Baseline, "1 sandbox held (same run): p50 3.00 ms, p99 10.0 ms") {
		t.Errorf("against one sandbox: %+v", r)
	}
	for name, r := range map[string]densityResult{
		"slow":    {N: 100, Aim: 100, Per: perSandbox{Total: 10}, Warm: append(fast, 30)},
		"failed":  {N: 100, Aim: 100, Per: perSandbox{Total: 10}, Warm: fast, Failed: 1},
		"fat":     {N: 100, Aim: 100, Per: perSandbox{Total: 25}, Warm: fast},
		"stopped": {N: 80, Aim: 100, Per: perSandbox{Total: 10}, Warm: fast, Stopped: "the budget ran out"},
	} {
		row := densityRow(r)
		if row.Met {
			t.Errorf("%s: met: %+v", name, row)
		}
		if name == "stopped" && (!strings.Contains(row.Measure, "80 held of 100") || !strings.Contains(row.Note, "the budget ran out")) {
			t.Errorf("stopped: %+v", row)
		}
	}
}

// TestOurs: only the shims and overlay mounts of the given containers
// count, not the host's others.
func TestOurs(t *testing.T) {
	procs := []proc{
		{comm: "containerd-shim", args: []string{"/usr/bin/containerd-shim-runc-v2", "-namespace", "moby", "-id", "aaa", "-address", "x"}, pss: 3},
		{comm: "containerd-shim", args: []string{"/usr/bin/containerd-shim-runc-v2", "-namespace", "moby", "-id", "zzz"}, pss: 100},
		{comm: "fuse-overlayfs", args: []string{"fuse-overlayfs", "-o", "lowerdir=/l/A:/l/B,upperdir=/d/1/diff,workdir=/d/1/work", "/d/1/merged"}, pss: 5},
		{comm: "fuse-overlayfs", args: []string{"fuse-overlayfs", "-o", "lowerdir=/l/A,upperdir=/d/9/diff,workdir=/d/9/work", "/d/9/merged"}, pss: 1000},
		{comm: "dockerd", pss: 10000},
	}
	procs[0].threads, procs[2].threads, procs[4].threads = 11, 1, 50
	if s, o, n := ours(procs, []string{"aaa", "bbb"}, []string{"/d/1/diff"}); s != 3 || o != 5 || n != 12 {
		t.Errorf("ours = %d, %d, %d threads; want 3, 5, 12", s, o, n)
	}
}

func TestStatTicks(t *testing.T) {
	line := "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 3 0 100 0 0"
	if got := statTicks(line); got != 22 {
		t.Errorf("statTicks = %d, want 17+5", got)
	}
	if got := statTicks("garbage"); got != 0 {
		t.Errorf("statTicks(garbage) = %d", got)
	}
}

// TestDockersContainerd: of two containerd on the host (a Kubernetes node's
// beside the engine's), only the engine's counts; a lone one always does.
func TestDockersContainerd(t *testing.T) {
	docker := proc{comm: "containerd", args: []string{"containerd", "--config", "/var/run/docker/containerd/containerd.toml"}}
	node := proc{comm: "containerd", args: []string{"containerd", "--config", "/srv/k8s/containerd.toml"}}
	both := []proc{docker, node}
	if !dockersContainerd(both, docker) || dockersContainerd(both, node) || !dockersContainerd([]proc{node}, node) {
		t.Error("dockersContainerd chose the wrong containerd")
	}
}
