// Command sandbox-bench measures sandbox-mcp against its baselines, side by
// side in one run (every performance goal in docs/bench/README.md), through a real
// MCP client, and writes the results as JSON, a Markdown table and a plot
// of the latency distributions.
//
//	go run ./cmd/sandbox-bench -bin bin -out docs/bench -doc docs/bench/README.md -readme README.md    (make bench)
//
// The plot is drawn by the module in cmd/sandbox-bench/plot, which it runs
// with the go command: the plotting library stays out of the server's
// go.mod.
//
// Every measure is repeated and reported as a median (and p99 where it
// matters) with its ratio to a baseline measured in the same run: these
// machines are shared and noisy, so absolute times drift but ratios hold.
// It is a program, not a test: nothing here fails on a slow day.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/image"
)

func main() {
	bin := flag.String("bin", "bin", "`dir`ectory holding sandbox-mcp and sandbox-agent (make build)")
	img := flag.String("image", image.DefaultTag(), "sandbox `image` to measure with (must exist locally)")
	out := flag.String("out", "docs/bench", "`dir`ectory for results.json, results.md and latency.png")
	scale := flag.Float64("scale", 1, "multiply every repetition count by this (0.2 for a quick look)")
	doc := flag.String("doc", "", "`file` whose block between the table markers gets the whole table (docs/bench/README.md)")
	readme := flag.String("readme", "", "`file` whose block between the headline markers gets the three headline numbers (README.md)")
	only := flag.String("only", "", "comma list of `steps` to run, by a word of their name (\"read\" runs the 1 MiB read and write rows); all when empty")
	plotDir := flag.String("plot", filepath.Join("cmd", "sandbox-bench", "plot"), "`dir`ectory of the plotting module, which draws latency.png (\"\" to skip the plot)")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig `file` of a cluster for the Kubernetes rows (none: skipped)")
	agentImage := flag.String("agent-image", "", "agent `image` for the Kubernetes rows (make k8s-images prints it)")
	kubectl := flag.String("kubectl", "kubectl", "kubectl `binary` for the Kubernetes baseline")
	densityNs := flag.String("density", "100,500,1000", "comma list of `counts` of idle sandboxes the density row measures at (a short run: 20,50)")
	densityBudget := flag.Duration("density-budget", 25*time.Minute, "wall `time` the density row may spend creating sandboxes; past it, it reports the count it reached")
	flag.Parse()
	ns, err := parseDensity(*densityNs)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "bench")
	b := &bench{bin: *bin, image: *img, scale: *scale, log: log, only: *only,
		kube:        &kubeBench{kubeconfig: *kubeconfig, agent: *agentImage, kubectl: *kubectl},
		densityOpts: densityOpts{ns: ns, budget: *densityBudget}}
	// An interrupt ends the step under way, whose deferred clean-ups
	// remove the servers and containers it made.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := b.run(ctx); err != nil {
		log.Error("bench failed", "err", err)
		os.Exit(1)
	}
	if err := b.write(*out, *plotDir); err != nil {
		log.Error("writing results", "err", err)
		os.Exit(1)
	}
	if err := b.updateDocs(*doc, *readme); err != nil {
		log.Error("updating the docs", "err", err)
		os.Exit(1)
	}
	fmt.Print(b.markdown())
}

// bench holds one run.
type bench struct {
	bin   string
	image string
	scale float64
	log   *slog.Logger
	only  string // comma list of words; a step runs when its name holds one (all when empty)
	kube  *kubeBench

	densityOpts densityOpts

	Machine Machine  `json:"machine"`
	Rows    []Row    `json:"rows"`
	Series  []Series `json:"series"` // raw samples, for the plot
}

// Machine describes where the numbers come from.
type Machine struct {
	Date     string `json:"date"`
	CPUs     int    `json:"cpus"`
	Kernel   string `json:"kernel"`
	Docker   string `json:"docker"`
	Go       string `json:"go"`
	Image    string `json:"image"`
	Duration string `json:"duration"`
}

// Row is one line of the results table.
type Row struct {
	Measure  string  `json:"measure"`
	Value    string  `json:"value"`    // ours, e.g. "3.1 ms (p99 5.0 ms)"
	Baseline string  `json:"baseline"` // what we compare with, and its value
	Ratio    float64 `json:"ratio"`    // ours / baseline; 0 when there is none
	Goal     string  `json:"goal"`
	Met      bool    `json:"met"`
	Note     string  `json:"note,omitempty"`
}

// Series is a set of latency samples in milliseconds.
type Series struct {
	Name    string    `json:"name"`
	Samples []float64 `json:"samples_ms"`
}

func (b *bench) n(base int) int { return max(3, int(float64(base)*b.scale)) }

func (b *bench) add(r Row) {
	b.Rows = append(b.Rows, r)
	b.log.Info("measured", "measure", r.Measure, "value", r.Value, "baseline", r.Baseline, "ratio", fmt.Sprintf("%.3f", r.Ratio), "goal", r.Goal, "met", r.Met)
}

func (b *bench) series(name string, ms []float64) {
	b.Series = append(b.Series, Series{Name: name, Samples: ms})
}

func (b *bench) run(ctx context.Context) error {
	start := time.Now()
	b.Machine = machine(b.image)
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"first exec of a new session", b.firstExec},
		{"first start after a build", b.firstStart},
		{"warm exec", b.warmExec},
		{"warm exec after a 1 s pause", b.idleExec},
		{"1 MiB read and write", b.fileIO},
		{"32 sessions × 50 execs", b.concurrent},
		{"memory per idle session", b.memory},
		{"proxy", b.proxy},
		{"secrets", b.secrets},
		{"preview", b.preview},
		{"kubernetes", b.kubernetes},
		{"idle sandboxes (density)", b.density},
	}
	for _, s := range steps {
		if !b.selected(s.name) {
			continue
		}
		b.log.Info("step", "name", s.name)
		if err := s.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	b.Machine.Duration = time.Since(start).Round(time.Second).String()
	return nil
}

// selected reports whether the step called name runs (see -only).
func (b *bench) selected(name string) bool {
	if b.only == "" {
		return true
	}
	for _, w := range strings.Split(b.only, ",") {
		if w = strings.TrimSpace(w); w != "" && strings.Contains(name, w) {
			return true
		}
	}
	return false
}

func machine(img string) Machine {
	m := Machine{Date: time.Now().UTC().Format("2006-01-02"), CPUs: runtime.NumCPU(), Go: runtime.Version(), Image: img}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.Docker = strings.TrimSpace(cmdOutput("docker", "version", "--format", "{{.Server.Version}} (runc {{range .Server.Components}}{{if eq .Name \"runc\"}}{{.Version}}{{end}}{{end}})"))
	return m
}

// write writes results.json and results.md into dir, then has the plotting
// module in plotDir draw latency.png from results.json.
func (b *bench) write(dir, plotDir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(b.markdown()), 0o644); err != nil {
		return err
	}
	if plotDir == "" {
		return nil
	}
	in, err := filepath.Abs(filepath.Join(dir, "results.json"))
	if err != nil {
		return err
	}
	out, err := filepath.Abs(filepath.Join(dir, "latency.png"))
	if err != nil {
		return err
	}
	plot := exec.Command("go", "-C", plotDir, "run", ".", "-in", in, "-out", out)
	if msg, err := plot.CombinedOutput(); err != nil {
		return fmt.Errorf("draw the plot with %s (-plot names its directory; \"\" skips it): %v\n%s", plotDir, err, msg)
	}
	return nil
}

func (b *bench) markdown() string {
	var s strings.Builder
	fmt.Fprintf(&s, "Measured %s on %d CPUs, kernel %s, Docker %s, %s, image `%s`; the whole run took %s.\n\n",
		b.Machine.Date, b.Machine.CPUs, b.Machine.Kernel, b.Machine.Docker, b.Machine.Go, b.Machine.Image, b.Machine.Duration)
	s.WriteString("| measure | sandbox-mcp | baseline (same run) | ratio | goal | met |\n|---|---|---|---|---|---|\n")
	for _, r := range b.Rows {
		ratio := "—"
		if r.Ratio > 0 {
			ratio = fmt.Sprintf("%.3f×", r.Ratio)
		}
		met := "yes"
		if !r.Met {
			met = "**no**"
		}
		fmt.Fprintf(&s, "| %s | %s | %s | %s | %s | %s |\n", r.Measure, r.Value, r.Baseline, ratio, r.Goal, met)
	}
	var notes []string
	for _, r := range b.Rows {
		if r.Note != "" {
			notes = append(notes, fmt.Sprintf("- %s: %s", r.Measure, r.Note))
		}
	}
	if len(notes) > 0 {
		s.WriteString("\n" + strings.Join(notes, "\n") + "\n")
	}
	return s.String()
}
