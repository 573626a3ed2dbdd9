package reconcile

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/fence"
	"github.com/retrysafe/retrysafe/internal/clock"
	"github.com/retrysafe/retrysafe/retry"
)

// Errors a pass returns, matched with errors.Is.
var (
	// ErrRepairFailed: at least one repair failed after its retries; the pass's Report
	// says which (Result.Err). The next pass tries again.
	ErrRepairFailed = errors.New("reconcile: repairs failed")
	// ErrTooMuchDrift: a pass found more drifted items than Config.MaxRepairs, so it
	// repaired nothing and only reported.
	ErrTooMuchDrift = errors.New("reconcile: more drift than MaxRepairs")
)

// releaseTimeout bounds the release of the lease after a pass, which runs even when
// the caller's context has ended.
const releaseTimeout = 5 * time.Second

// Config configures a Reconciler. The zero value of each field but Desired and Actual
// means its default.
type Config[T any] struct {
	// Name identifies the reconciler: the name of its lease and the value of the
	// "reconciler" label of its metrics. Default "reconcile".
	Name string

	// Desired lists the desired state (the source of truth, such as PostgreSQL).
	// Required.
	Desired Lister[T]
	// Actual lists the actual state (such as an external system). Required.
	Actual Lister[T]
	// Equal reports whether an actual item matches its desired one; compare a version
	// or a hash when the items carry one. Default reflect.DeepEqual.
	Equal func(desired, actual T) bool

	// Repair makes one drifted item right: create a Missing item, delete an Extra one,
	// update a Different one. It is retried under Retry; return retry.Permanent(err)
	// for an error not worth retrying. With Leases set, ctx is the lease's Context: it
	// is cancelled when the lease is lost, and fence.FromContext(ctx) returns the lease,
	// whose Token and Check fence the repair's writes (a repair that writes with a stale
	// token gets fence.ErrStaleToken, which is not retried). Default nil: report only.
	Repair func(ctx context.Context, d Drift[T]) error
	// ReportOnly finds and reports drift without calling Repair (a dry run). Default
	// false.
	ReportOnly bool
	// MaxRepairs is a safety limit: a pass that finds more drifted items than this
	// repairs none of them and fails with ErrTooMuchDrift (a lister that wrongly
	// returned nothing must not make the reconciler delete or recreate everything).
	// Default 0: no limit.
	MaxRepairs int

	// Interval is the time between the starts of passes in Run. Default 5 minutes.
	Interval time.Duration
	// Jitter spreads the intervals: each is Interval × (1 ± Jitter), uniformly, so that
	// replicas do not wake together. At most 1. Default 0.1; negative means none.
	Jitter float64
	// Retry is the retry policy of each repair and of each listing. Default the zero
	// retry.Policy (retry.DefaultPolicy: 5 attempts, full jitter from 300ms, capped at
	// 10s). Its Clock and Rand default to the Config's.
	Retry retry.Policy

	// Leases, when set, makes sure only one replica reconciles at a time: a pass runs
	// only under the lease called Name, and Run keeps the lease from pass to pass (the
	// other replicas skip their passes until the holder stops or loses it). Default
	// nil: no lease; run a single replica.
	Leases *fence.Store
	// LeaseTTL is the lease's time to live; it is renewed every LeaseTTL/3 while held.
	// A replica that dies is replaced within LeaseTTL plus an Interval. Default 30s.
	LeaseTTL time.Duration
	// Holder names this replica in the lease table. Default host name, process id and a
	// random suffix.
	Holder string

	// Registerer receives the metrics (drift found, repaired, repair failures, passes,
	// pass duration, last success), labelled reconciler=Name. Default nil: no metrics.
	// Reconcilers sharing a Registerer need distinct Names.
	Registerer prometheus.Registerer
	// Logger receives pass summaries, failed repairs and lease changes. Default
	// slog.Default().
	Logger *slog.Logger
	// Clock is the application's clock: intervals, report times, retry waits. Default
	// the real clock.
	Clock retry.Clock
	// Rand returns a float in [0, 1), for the interval's jitter. Default math/rand/v2's
	// Float64.
	Rand func() float64
}

// Reconciler compares desired with actual state and repairs or reports the drift.
// RunOnce runs one pass; Run runs passes until its context ends.
type Reconciler[T any] struct {
	cfg Config[T]
	m   *metrics
}

// Result is what a pass did with one drifted item.
type Result[T any] struct {
	Drift[T]
	Repaired bool
	Attempts int   // calls of Repair; 0 when the pass only reported
	Err      error // why the repair failed, after its retries
}

// Report is the outcome of one pass.
type Report[T any] struct {
	Started, Finished time.Time // by Config.Clock
	// Skipped: another replica holds the lease, so this pass listed nothing.
	Skipped bool
	// Token is the fencing token of the lease the pass ran under; 0 without Leases.
	Token int64
	// Desired and Actual are the numbers of items listed.
	Desired, Actual int
	// Items has one entry per drifted item, in key order.
	Items []Result[T]
	// Drift found, by kind, and what the repairs did.
	Missing, Extra, Different int
	Repaired, Failed          int
}

// Drifted returns the number of drifted items found.
func (r Report[T]) Drifted() int { return r.Missing + r.Extra + r.Different }

// New returns a Reconciler, or an error when cfg is unusable or its metrics cannot be
// registered.
func New[T any](cfg Config[T]) (*Reconciler[T], error) {
	if cfg.Desired == nil || cfg.Actual == nil {
		return nil, errors.New("reconcile: Config.Desired and Config.Actual are required")
	}
	switch {
	case cfg.Interval < 0:
		return nil, fmt.Errorf("reconcile: negative Config.Interval %s", cfg.Interval)
	case cfg.LeaseTTL < 0 || cfg.LeaseTTL > 0 && cfg.LeaseTTL < fence.MinTTL:
		return nil, fmt.Errorf("reconcile: Config.LeaseTTL %s is shorter than %s", cfg.LeaseTTL, fence.MinTTL)
	case cfg.MaxRepairs < 0:
		return nil, fmt.Errorf("reconcile: negative Config.MaxRepairs %d", cfg.MaxRepairs)
	case cfg.Jitter > 1 || cfg.Jitter != cfg.Jitter: // NaN
		return nil, fmt.Errorf("reconcile: Config.Jitter %v is more than 1", cfg.Jitter)
	}
	cfg.Name = cmp.Or(cfg.Name, "reconcile")
	cfg.Interval = cmp.Or(cfg.Interval, 5*time.Minute)
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, 30*time.Second)
	switch {
	case cfg.Jitter == 0:
		cfg.Jitter = 0.1
	case cfg.Jitter < 0:
		cfg.Jitter = 0
	}
	if cfg.Equal == nil {
		cfg.Equal = func(d, a T) bool { return reflect.DeepEqual(d, a) }
	}
	if cfg.Holder == "" {
		cfg.Holder = defaultHolder()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Rand == nil {
		cfg.Rand = mrand.Float64
	}
	if cfg.Retry.Clock == nil {
		cfg.Retry.Clock = cfg.Clock
	}
	if cfg.Retry.Rand == nil {
		cfg.Retry.Rand = cfg.Rand
	}
	m, err := newMetrics(cfg.Registerer, cfg.Name)
	if err != nil {
		return nil, err
	}
	return &Reconciler[T]{cfg: cfg, m: m}, nil
}

func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b)
}

// RunOnce runs one pass: it lists both sides, diffs them, and repairs each drifted item
// (with retries) unless reporting only. With Leases set it first acquires the lease
// (when another replica holds it, it returns a Report with Skipped set and a nil error)
// and releases it after the pass.
//
// The error is nil when the pass converged or only reported. Otherwise it says why:
// listing failed, ErrTooMuchDrift, ErrRepairFailed (the Report's Items say which), or
// the pass stopped early, because ctx ended or the lease was lost (the error then wraps
// the context's cause, fence.ErrLeaseLost for a lost lease).
func (r *Reconciler[T]) RunOnce(ctx context.Context) (Report[T], error) {
	if r.cfg.Leases == nil {
		return r.pass(ctx, 0)
	}
	lease, rep, err := r.acquire(ctx)
	if lease == nil {
		return rep, err
	}
	defer r.release(ctx, lease)
	return r.pass(lease.Context(), lease.Token())
}

// Run runs a pass at once, then one every Interval (with Jitter), until ctx ends, and
// returns ctx's cause. Failures are logged, counted in the metrics and retried at the
// next pass. With Leases set, Run keeps the lease between passes while it holds it;
// when the lease is held elsewhere it tries again at each interval; it releases the
// lease when it returns.
func (r *Reconciler[T]) Run(ctx context.Context) error {
	var lease *fence.Lease
	defer func() {
		if lease != nil {
			r.release(ctx, lease)
		}
	}()
	for {
		switch {
		case r.cfg.Leases == nil:
			_, _ = r.pass(ctx, 0)
		default:
			if lease != nil && lease.Context().Err() != nil {
				r.release(ctx, lease) // lost: frees it too if it merely expired
				lease = nil
			}
			if lease == nil {
				lease, _, _ = r.acquire(ctx)
			}
			if lease != nil {
				_, _ = r.pass(lease.Context(), lease.Token())
			}
		}
		if err := clock.Sleep(ctx, r.cfg.Clock, r.interval()); err != nil {
			return context.Cause(ctx)
		}
	}
}

// acquire takes the lease. When it is held elsewhere, or cannot be taken, it returns a
// nil lease and the Report and error RunOnce returns.
func (r *Reconciler[T]) acquire(ctx context.Context) (*fence.Lease, Report[T], error) {
	now := r.cfg.Clock.Now()
	lease, err := r.cfg.Leases.Acquire(ctx, r.cfg.Name, r.cfg.Holder, r.cfg.LeaseTTL)
	switch {
	case err == nil:
		r.cfg.Logger.InfoContext(ctx, "reconcile: lease acquired", "reconciler", r.cfg.Name,
			"holder", r.cfg.Holder, "token", lease.Token())
		return lease, Report[T]{}, nil
	case errors.Is(err, fence.ErrHeld):
		r.m.skipped()
		r.cfg.Logger.DebugContext(ctx, "reconcile: pass skipped, the lease is held", "reconciler", r.cfg.Name, "err", err)
		return nil, Report[T]{Started: now, Finished: r.cfg.Clock.Now(), Skipped: true}, nil
	default:
		r.m.noLease()
		if ctx.Err() == nil {
			r.cfg.Logger.WarnContext(ctx, "reconcile: cannot acquire the lease", "reconciler", r.cfg.Name, "err", err)
		}
		err = fmt.Errorf("reconcile %s: acquiring the lease: %w", r.cfg.Name, err)
		return nil, Report[T]{Started: now, Finished: r.cfg.Clock.Now()}, err
	}
}

func (r *Reconciler[T]) release(ctx context.Context, lease *fence.Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	switch err := lease.Release(rctx); {
	case errors.Is(err, fence.ErrLeaseLost): // fence logged the loss
		r.cfg.Logger.DebugContext(ctx, "reconcile: released a lost lease", "reconciler", r.cfg.Name,
			"token", lease.Token(), "err", err)
	case err != nil:
		r.cfg.Logger.WarnContext(ctx, "reconcile: lease release failed; it expires at its TTL", "reconciler", r.cfg.Name,
			"token", lease.Token(), "err", err)
	}
}

// pass runs one pass under ctx and records it in the metrics and the log.
func (r *Reconciler[T]) pass(ctx context.Context, token int64) (Report[T], error) {
	rep := Report[T]{Started: r.cfg.Clock.Now(), Token: token}
	listed, err := r.reconcile(ctx, &rep)
	rep.Finished = r.cfg.Clock.Now()
	var counts map[Kind]int
	if listed {
		counts = map[Kind]int{Missing: rep.Missing, Extra: rep.Extra, Different: rep.Different}
	}
	r.m.pass(counts, rep.Finished.Sub(rep.Started), rep.Finished, err)
	attrs := []any{"reconciler", r.cfg.Name, "token", token, "desired", rep.Desired, "actual", rep.Actual,
		"missing", rep.Missing, "extra", rep.Extra, "different", rep.Different,
		"repaired", rep.Repaired, "failed", rep.Failed, "duration", rep.Finished.Sub(rep.Started)}
	switch {
	case err != nil:
		r.cfg.Logger.WarnContext(ctx, "reconcile: pass failed", append(attrs, "err", err)...)
	case rep.Drifted() > 0:
		r.cfg.Logger.InfoContext(ctx, "reconcile: drift found", attrs...)
	default:
		r.cfg.Logger.DebugContext(ctx, "reconcile: no drift", attrs...)
	}
	return rep, err
}

// reconcile lists, diffs and repairs into rep; listed says whether it got to the diff.
func (r *Reconciler[T]) reconcile(ctx context.Context, rep *Report[T]) (listed bool, err error) {
	desired, err := retry.DoValue(ctx, r.cfg.Retry, r.cfg.Desired.List)
	if err != nil {
		return false, fmt.Errorf("reconcile %s: listing the desired state: %w", r.cfg.Name, err)
	}
	actual, err := retry.DoValue(ctx, r.cfg.Retry, r.cfg.Actual.List)
	if err != nil {
		return false, fmt.Errorf("reconcile %s: listing the actual state: %w", r.cfg.Name, err)
	}
	rep.Desired, rep.Actual = len(desired), len(actual)
	drift := Diff(desired, actual, r.cfg.Equal)
	rep.Items = make([]Result[T], len(drift))
	for i, d := range drift {
		rep.Items[i].Drift = d
		switch d.Kind {
		case Missing:
			rep.Missing++
		case Extra:
			rep.Extra++
		case Different:
			rep.Different++
		}
		r.cfg.Logger.DebugContext(ctx, "reconcile: drift", "reconciler", r.cfg.Name, "key", d.Key, "kind", d.Kind)
	}
	if len(drift) == 0 || r.cfg.Repair == nil || r.cfg.ReportOnly {
		return true, nil
	}
	if r.cfg.MaxRepairs > 0 && len(drift) > r.cfg.MaxRepairs {
		return true, fmt.Errorf("reconcile %s: %d drifted items, more than MaxRepairs (%d): %w",
			r.cfg.Name, len(drift), r.cfg.MaxRepairs, ErrTooMuchDrift)
	}
	var first *Result[T]
	for i := range rep.Items {
		it := &rep.Items[i]
		if ctx.Err() != nil {
			return true, fmt.Errorf("reconcile %s: stopped after %d of %d repairs: %w",
				r.cfg.Name, i, len(rep.Items), context.Cause(ctx))
		}
		it.Attempts, it.Err = r.repair(ctx, it.Drift)
		r.m.repair(it.Kind, it.Err)
		if it.Err == nil {
			it.Repaired = true
			rep.Repaired++
			continue
		}
		rep.Failed++
		if first == nil {
			first = it
		}
		r.cfg.Logger.WarnContext(ctx, "reconcile: repair failed", "reconciler", r.cfg.Name,
			"key", it.Key, "kind", it.Kind, "attempts", it.Attempts, "err", it.Err)
	}
	if ctx.Err() != nil {
		return true, fmt.Errorf("reconcile %s: stopped during the repairs: %w", r.cfg.Name, context.Cause(ctx))
	}
	if first != nil {
		return true, fmt.Errorf("reconcile %s: %d of %d repairs failed (first %s %q: %w): %w",
			r.cfg.Name, rep.Failed, len(rep.Items), first.Kind, first.Key, first.Err, ErrRepairFailed)
	}
	return true, nil
}

// repair calls Repair under the retry policy. A stale token or a lost lease is not
// retried: another replica has taken over.
func (r *Reconciler[T]) repair(ctx context.Context, d Drift[T]) (int, error) {
	attempts := 0
	err := retry.Do(ctx, r.cfg.Retry, func(ctx context.Context) error {
		attempts++
		err := r.cfg.Repair(ctx, d)
		if errors.Is(err, fence.ErrStaleToken) || errors.Is(err, fence.ErrLeaseLost) {
			return retry.Permanent(err)
		}
		return err
	})
	return attempts, err
}

// interval returns the next wait: Interval × (1 ± Jitter).
func (r *Reconciler[T]) interval() time.Duration {
	f := 1 + r.cfg.Jitter*(2*r.cfg.Rand()-1)
	return time.Duration(float64(r.cfg.Interval) * f)
}
