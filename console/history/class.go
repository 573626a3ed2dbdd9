package history

// Class groups the gateway's outcome label values into what an operator reads on a
// chart. The order of the constants is the order of a chart's stack, bottom to top, and
// of its legend.
type Class int

// The outcome classes. ClassOf maps each outcome value of the gateway onto one of them.
const (
	ClassExecuted        Class = iota // the key was claimed and the upstream's answer stored
	ClassReplayed                     // answered from the stored response
	ClassInFlight                     // 409: the key was in progress
	ClassMismatch                     // 422: the key was reused with another request
	ClassOther4xx                     // any other refusal of the request itself (400, 404, 408, 413)
	ClassStoreError                   // the store failed during the request
	ClassUpstreamFailure              // the upstream was not reached, failed, timed out or said it did not do the work
	ClassOther                        // everything else, unknown outcome values included

	// NumClasses is the number of classes: the length of Counts.
	NumClasses = int(ClassOther) + 1
)

// String returns the class's name as a legend shows it.
func (c Class) String() string {
	switch c {
	case ClassExecuted:
		return "executed"
	case ClassReplayed:
		return "replayed"
	case ClassInFlight:
		return "409 in flight"
	case ClassMismatch:
		return "422 mismatch"
	case ClassOther4xx:
		return "other 4xx"
	case ClassStoreError:
		return "store error"
	case ClassUpstreamFailure:
		return "upstream failure"
	case ClassOther:
		return "other"
	}
	return "unknown"
}

// Color returns the class's colour on a chart, as #rrggbb. The colours of failures are
// warm (red, orange), those of answers from the store cool, so that a chart reads at a
// glance.
func (c Class) Color() string {
	switch c {
	case ClassExecuted:
		return "#2e7d32" // green
	case ClassReplayed:
		return "#1565c0" // blue
	case ClassInFlight:
		return "#f9a825" // amber
	case ClassMismatch:
		return "#6a1b9a" // purple
	case ClassOther4xx:
		return "#8d6e63" // brown
	case ClassStoreError:
		return "#c62828" // red
	case ClassUpstreamFailure:
		return "#ef6c00" // orange
	}
	return "#9e9e9e" // grey: other
}

// Classes returns every class, in chart order.
func Classes() []Class {
	cs := make([]Class, NumClasses)
	for i := range cs {
		cs[i] = Class(i)
	}
	return cs
}

// ClassOf returns the class of one value of the gateway's outcome label, and whether the
// value is one the table knows; an unknown value is ClassOther, so that a count is never
// lost. This switch is the table of the package doc: the two change together.
func ClassOf(outcome string) (Class, bool) {
	switch outcome {
	case "executed", // claimed, forwarded, the answer stored
		"done-aborted": // stored, then the answer broke off: a retry gets the replay
		return ClassExecuted, true
	case "replayed":
		return ClassReplayed, true
	case "conflict":
		return ClassInFlight, true
	case "mismatch":
		return ClassMismatch, true
	case "missing-key", "invalid-key", "invalid-method", "bad-body", "hop-by-hop", // 400
		"no-route",     // 404
		"body-timeout", // 408
		"too-large":    // 413
		return ClassOther4xx, true
	case "store-error", // 503, fail closed: nothing forwarded
		"store-not-durable", // 503: the store cannot make writes durable now; nothing forwarded
		"failed-open",       // the store failed; forwarded unprotected
		"stored-later":      // forwarded; the store could not take the answer yet
		return ClassStoreError, true
	case "released", // 502 upstream unreachable, or its own 429/503: key released
		"abandoned": // 504 timeout or 502 broken connection after sending: key left to its lease
		return ClassUpstreamFailure, true
	case "pass-through", // unkeyed: forwarded without claim or store
		"lease-lost",        // forwarded, but another request took the key over
		"client-gone",       // the client left before any answer
		"overloaded",        // 503: request bodies in memory at their bound
		"deadline-exceeded", // 504: the request's deadline passed before it could run
		"budget-exhausted",  // 504: the caller's budget was spent on arrival
		"error":             // the request panicked before an outcome
		return ClassOther, true
	}
	return ClassOther, false
}

// Counts are request counts by class, indexed by Class.
type Counts [NumClasses]uint64

// Total returns the sum of the counts.
func (c Counts) Total() uint64 {
	var n uint64
	for _, v := range c {
		n += v
	}
	return n
}
