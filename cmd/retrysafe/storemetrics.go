package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/retrysafe/retrysafe/idempotency"
)

// unsafeReporter is a store that reports the conditions under which it cannot keep its
// promise now, as its last check found them (redisstore.Store.Unsafe).
type unsafeReporter interface {
	Unsafe() (evicting, replicas bool)
}

// storeRegistry returns the registry the gateway's metrics go to when the store reports
// its conditions: the gateway's own collectors (Go, process) and
// retrysafe_store_unsafe{reason}, 1 while the store's last check found the reason
// (eviction: a maxmemory-policy that may evict records, allowed or not; replicas: fewer
// replicas acknowledged the last write or ping than wait=N asks). Nil for other stores:
// the gateway makes its registry itself.
func storeRegistry(s idempotency.Store) *prometheus.Registry {
	u, ok := s.(unsafeReporter)
	if !ok {
		return nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, reason := range []string{"eviction", "replicas"} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace:   "retrysafe",
			Subsystem:   "store",
			Name:        "unsafe",
			Help:        "1 while the store's last check found that it cannot keep its promise for the reason: eviction (a Redis maxmemory-policy that may evict records, allowed or not), replicas (fewer replicas acknowledged the last write than the store's wait=N asks).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 {
			evicting, replicas := u.Unsafe()
			if reason == "eviction" && evicting || reason == "replicas" && replicas {
				return 1
			}
			return 0
		}))
	}
	return reg
}
