package main

import (
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// plotLatency draws one box plot per series, on a log scale.
func plotLatency(series []Series, path string) error {
	p := plot.New()
	p.Title.Text = "sandbox-mcp latency distributions (one run, same machine)"
	p.Y.Label.Text = "milliseconds (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	var names []string
	for i, s := range series {
		vals := make(plotter.Values, 0, len(s.Samples))
		for _, v := range s.Samples {
			vals = append(vals, max(v, 0.01))
		}
		box, err := plotter.NewBoxPlot(vg.Points(18), float64(i), vals)
		if err != nil {
			return err
		}
		p.Add(box)
		names = append(names, s.Name)
	}
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.6
	p.X.Tick.Label.XAlign = -1.0
	p.X.Tick.Label.YAlign = -0.5
	p.Add(plotter.NewGrid())
	return p.Save(vg.Points(float64(90*len(series)+160)), 9*vg.Inch, path)
}
