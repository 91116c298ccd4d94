// Command plot draws the latency distributions of a sandbox-bench run: one
// box plot per series of results.json, on a log scale, as a PNG.
//
//	go -C cmd/sandbox-bench/plot run . -in docs/bench/results.json -out docs/bench/latency.png
//
// sandbox-bench runs it after a run. It is a module of its own so that the
// plotting library and what it pulls in (fonts, PDF and SVG writers) stay
// out of the server's go.mod, which lists what the server runs.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// results is the part of sandbox-bench's results.json drawn here.
type results struct {
	Series []series `json:"series"`
}

// series is a set of latency samples in milliseconds.
type series struct {
	Name    string    `json:"name"`
	Samples []float64 `json:"samples_ms"`
}

func main() {
	in := flag.String("in", "docs/bench/results.json", "`file` written by sandbox-bench")
	out := flag.String("out", "docs/bench/latency.png", "`file` to write the PNG to")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	b, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if len(r.Series) == 0 {
		return errors.New(in + " holds no series of samples: run sandbox-bench first")
	}
	return plotLatency(r.Series, out)
}

// plotLatency draws one box plot per series, on a log scale.
func plotLatency(all []series, path string) error {
	p := plot.New()
	p.Title.Text = "sandbox-mcp latency distributions (one run, same machine)"
	p.Y.Label.Text = "milliseconds (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	var names []string
	for i, s := range all {
		vals := make(plotter.Values, 0, len(s.Samples))
		for _, v := range s.Samples {
			vals = append(vals, max(v, 0.01))
		}
		box, err := plotter.NewBoxPlot(vg.Points(18), float64(i), vals)
		if err != nil {
			return fmt.Errorf("series %q: %w", s.Name, err)
		}
		p.Add(box)
		names = append(names, s.Name)
	}
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.6
	p.X.Tick.Label.XAlign = -1.0
	p.X.Tick.Label.YAlign = -0.5
	p.Add(plotter.NewGrid())
	return p.Save(vg.Points(float64(90*len(all)+160)), 9*vg.Inch, path)
}
