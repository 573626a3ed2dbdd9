package reconcile

import (
	"cmp"
	"context"
	"slices"
	"strconv"
)

// Kind is how an item drifted.
type Kind int

const (
	// Missing: desired, absent from the actual state.
	Missing Kind = iota + 1
	// Extra: in the actual state, not desired.
	Extra
	// Different: in both, but the actual item is not equal to the desired one.
	Different
)

var kinds = [...]Kind{Missing, Extra, Different}

func (k Kind) String() string {
	switch k {
	case Missing:
		return "missing"
	case Extra:
		return "extra"
	case Different:
		return "different"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Lister lists the items of one side, keyed by a string unique within the side. It
// lists everything each time (level-triggered: a pass never depends on what an earlier
// pass saw). An error fails the pass; the next pass lists again.
type Lister[T any] interface {
	List(ctx context.Context) (map[string]T, error)
}

// ListerFunc adapts a function to a Lister.
type ListerFunc[T any] func(ctx context.Context) (map[string]T, error)

// List calls f.
func (f ListerFunc[T]) List(ctx context.Context) (map[string]T, error) { return f(ctx) }

// Drift is one item on which the actual state differs from the desired state.
type Drift[T any] struct {
	Key     string
	Kind    Kind
	Desired T // the zero value when Kind is Extra
	Actual  T // the zero value when Kind is Missing
}

// Diff compares desired with actual by key and returns the drift, in key order:
// Missing for a key only in desired, Extra for a key only in actual, Different for a
// key in both whose items equal reports unequal (equal(desired, actual)). Compare a
// version or a hash in equal when the items carry one.
func Diff[T any](desired, actual map[string]T, equal func(desired, actual T) bool) []Drift[T] {
	var out []Drift[T]
	for k, d := range desired {
		a, ok := actual[k]
		switch {
		case !ok:
			out = append(out, Drift[T]{Key: k, Kind: Missing, Desired: d})
		case !equal(d, a):
			out = append(out, Drift[T]{Key: k, Kind: Different, Desired: d, Actual: a})
		}
	}
	for k, a := range actual {
		if _, ok := desired[k]; !ok {
			out = append(out, Drift[T]{Key: k, Kind: Extra, Actual: a})
		}
	}
	slices.SortFunc(out, func(a, b Drift[T]) int { return cmp.Compare(a.Key, b.Key) })
	return out
}
