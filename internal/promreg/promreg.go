// Package promreg is how the module's packages (gateway, redeliver, reconcile) register
// their Prometheus collectors. Each keeps them in one metrics struct, built by one
// constructor that hands every field to Register, so a package's metrics are registered
// all or none: a registration that fails leaves the registry as it was, and a corrected
// configuration can register them again.
package promreg

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Slot is one collector field of a metrics struct.
type Slot struct {
	c     prometheus.Collector
	adopt func(prometheus.Collector) bool // sets the field to an existing collector of its type
}

// Field is the Slot of the collector in *f.
func Field[C prometheus.Collector](f *C) Slot {
	return Slot{c: *f, adopt: func(existing prometheus.Collector) bool {
		e, ok := existing.(C)
		if ok {
			*f = e
		}
		return ok
	}}
}

// Register registers the slots' collectors with reg, in order. When one fails, it
// unregisters those it registered and returns the error as "<pkg>: registering metrics:
// …".
//
// With shared, a collector that reg already holds under the same description (another
// instance of the package registered it: several redeliver Consumers on one registry) is
// adopted instead: the slot's field is set to the registered collector, so all the
// instances count into the same series, and a failure later leaves it registered, since
// it belongs to the instance that registered it.
func Register(reg prometheus.Registerer, pkg string, shared bool, slots ...Slot) error {
	var done []prometheus.Collector
	for _, s := range slots {
		err := reg.Register(s.c)
		if err == nil {
			done = append(done, s.c)
			continue
		}
		var are prometheus.AlreadyRegisteredError
		if shared && errors.As(err, &are) && s.adopt(are.ExistingCollector) {
			continue
		}
		for _, c := range done {
			reg.Unregister(c)
		}
		return fmt.Errorf("%s: registering metrics: %w", pkg, err)
	}
	return nil
}

// Unregister unregisters the slots' collectors from reg: for a package whose
// constructor fails after Register succeeded, so that a corrected configuration can
// register them again. Not for collectors registered with shared, which other
// instances count into.
func Unregister(reg prometheus.Registerer, slots ...Slot) {
	for _, s := range slots {
		reg.Unregister(s.c)
	}
}
