package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// track registers a pod's stream with the pod watch (started at the first
// pod), so that the stream ends when the pod goes.
func (c *Cluster) track(name string, end context.CancelCauseFunc) {
	c.watchOnce.Do(c.startWatch)
	c.liveMu.Lock()
	defer c.liveMu.Unlock()
	if c.live == nil {
		c.live = map[string]context.CancelCauseFunc{}
	}
	c.live[name] = end
}

func (c *Cluster) untrack(name string) {
	c.liveMu.Lock()
	defer c.liveMu.Unlock()
	delete(c.live, name)
}

// gone ends the stream of a pod that is being deleted, was deleted, or
// ended.
func (c *Cluster) gone(obj any) {
	var p *corev1.Pod
	switch o := obj.(type) {
	case *corev1.Pod:
		p = o
	case cache.DeletedFinalStateUnknown:
		p, _ = o.Obj.(*corev1.Pod)
	}
	if p == nil {
		return
	}
	c.liveMu.Lock()
	end := c.live[p.Name]
	c.liveMu.Unlock()
	if end == nil {
		return
	}
	if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Labels[LabelInstance] != c.cfg.Instance {
		// It left this server's pods by its label: another server took
		// it over (Reattach), and it runs on.
		c.log.Info("kube: another server took the sandbox pod over; ending this server's stream", "pod", p.Name, "holder", p.Labels[LabelInstance])
		end(backend.ErrSuperseded)
		return
	}
	c.log.Info("kube: sandbox pod went away; ending its stream", "pod", p.Name, "phase", p.Status.Phase)
	end(nil)
}

// startWatch runs one informer on this server's sandbox pods until Close:
// one watch for all of them, whatever their number.
func (c *Cluster) startWatch() {
	c.liveMu.Lock()
	c.watchStop = make(chan struct{})
	stop := c.watchStop
	c.liveMu.Unlock()
	f := informers.NewSharedInformerFactoryWithOptions(c.cs, 0, informers.WithNamespace(c.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = LabelRole + "=sandbox," + LabelInstance + "=" + c.cfg.Instance
		}))
	inf := f.Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			p, ok := obj.(*corev1.Pod)
			if ok && (p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
				c.gone(p)
			}
		},
		DeleteFunc: c.gone,
	})
	f.Start(stop)
}
