// Package reconcile detects and repairs drift: a level-triggered loop that compares the
// desired state with the actual state and repairs, or reports, every difference.
//
// Retries, redeliveries and dead letters make each operation as reliable as they can,
// and some still fail: a side effect of state committed in PostgreSQL (a grant in an
// external system, a cache entry, a webhook registration) may never have happened, or
// happened twice, or was changed by hand. A reconciler does not replay history; it
// looks at both sides as they are now, so a discrepancy is flagged within an interval
// (5 minutes by default) whatever caused it, and a human can also repair by running a
// pass.
//
// A pass:
//
//  1. lists the desired state (Config.Desired, for example from PostgreSQL) and the
//     actual state (Config.Actual, for example an external system's API), each as a map
//     from a string key to an item, retrying a failed listing under Config.Retry;
//  2. diffs them by key (Diff): Missing (desired only), Extra (actual only), Different
//     (in both, but Config.Equal says they differ; compare versions or hashes there);
//  3. calls Config.Repair for each drifted item, in key order, retrying each under
//     Config.Retry (retry.Do: capped exponential backoff with jitter), or only reports
//     when Repair is nil or Config.ReportOnly is set;
//  4. returns a Report (counts, and per item whether it was repaired and why not) and
//     records metrics: drift found, repaired and failed by kind, passes by result, pass
//     duration and the time of the last successful pass (prometheus, on the caller's
//     Config.Registerer; none when it is nil).
//
// RunOnce runs one pass; Run runs one at once and then every Interval ± Jitter until
// its context ends.
//
// # One reconciler at a time
//
// With Config.Leases (a fence.Store), a pass runs only under the lease called
// Config.Name, so that among replicas only one reconciles at a time. Run keeps the lease
// from pass to pass while it holds it (its heartbeat renews it every LeaseTTL/3); the
// other replicas skip their passes (Report.Skipped, metric result "skipped") until it
// stops, releases or loses it. Repairs run under the lease's Context: when the lease
// is lost, the context is cancelled and the pass stops. A repair that writes to
// PostgreSQL can also fence its write with the lease's token, which
// fence.FromContext(ctx) returns: a replica that paused past its lease then gets
// fence.ErrStaleToken (not retried) instead of overwriting the newer holder's repair.
//
// # Safety
//
// A lister that wrongly returns nothing makes every item drift. Config.MaxRepairs bounds
// the drift a pass repairs: above it, the pass only reports and fails with
// ErrTooMuchDrift.
package reconcile
