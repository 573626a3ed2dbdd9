package retry

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

var errFlaky = errors.New("flaky")

// failing returns a function that fails with errs in turn, then succeeds, counting calls.
func failing(calls *int, errs ...error) func(context.Context) error {
	return func(context.Context) error {
		*calls++
		if *calls <= len(errs) {
			return errs[*calls-1]
		}
		return nil
	}
}

func TestDo(t *testing.T) {
	t.Parallel()
	errInner := errors.New("inner")
	tests := []struct {
		name       string
		policy     func(p *Policy)
		errs       []error // returned by the first attempts, then success
		ctx        func() (context.Context, context.CancelFunc)
		wantCalls  int
		wantErr    []error // the result matches each; nil: success
		wantExh    int     // > 0: an *ExhaustedError with these Attempts
		wantWaits  []time.Duration
		waitWithin [2]time.Duration // when set, the single wait lies in it
	}{
		{name: "success", wantCalls: 1},
		{name: "retried to success", errs: []error{errFlaky, errFlaky}, wantCalls: 3},
		{name: "Permanent stops", errs: []error{errFlaky, Permanent(errInner)}, wantCalls: 2, wantErr: []error{errInner}},
		{name: "Permanent stops even when Retryable says yes", policy: func(p *Policy) { p.Retryable = func(error) bool { return true } },
			errs: []error{Permanent(errInner)}, wantCalls: 1, wantErr: []error{errInner}},
		{name: "not retryable class", errs: []error{&StatusError{Class: ErrAuth, StatusCode: 401}}, wantCalls: 1, wantErr: []error{ErrAuth}},
		{name: "custom Retryable", policy: func(p *Policy) { p.Retryable = func(err error) bool { return !errors.Is(err, errInner) } },
			errs: []error{errFlaky, errInner}, wantCalls: 2, wantErr: []error{errInner}},
		{name: "attempts exhausted", errs: []error{errFlaky, errFlaky, errInner}, wantCalls: 3,
			wantErr: []error{ErrMaxAttempts, errInner}, wantExh: 3},
		{name: "After waits the asked time", policy: func(p *Policy) { p.Rand = zeroRand },
			errs: []error{After(3*time.Second, errFlaky)}, wantCalls: 2, wantWaits: []time.Duration{3 * time.Second}},
		{name: "After adds at most 10% upward", policy: func(p *Policy) { p.Rand = func() float64 { return almostOne }; p.Base = time.Hour; p.Cap = time.Hour },
			errs: []error{After(3*time.Second, errFlaky)}, wantCalls: 2, waitWithin: [2]time.Duration{3 * time.Second, 3300 * time.Millisecond}},
		{name: "After jitter at most Base", policy: func(p *Policy) { p.Rand = func() float64 { return almostOne }; p.Base = 10 * time.Millisecond },
			errs: []error{After(3*time.Second, errFlaky)}, wantCalls: 2, waitWithin: [2]time.Duration{3 * time.Second, 3010 * time.Millisecond}},
		{name: "After(0) still spreads", policy: func(p *Policy) { p.Rand = func() float64 { return almostOne }; p.Base = time.Second },
			errs: []error{After(0, errFlaky)}, wantCalls: 2, waitWithin: [2]time.Duration{99 * time.Millisecond, 100 * time.Millisecond}},
		{name: "server delay too long", errs: []error{After(2*time.Minute, errFlaky)}, wantCalls: 1,
			wantErr: []error{ErrServerDelay, errFlaky}, wantExh: 1},
		{name: "server delay within MaxServerDelay", policy: func(p *Policy) { p.MaxServerDelay = 5 * time.Minute; p.Rand = zeroRand },
			errs: []error{After(2*time.Minute, errFlaky)}, wantCalls: 2, wantWaits: []time.Duration{2 * time.Minute}},
		{name: "deadline before the next wait ends", policy: func(p *Policy) { p.Base = 10 * time.Second; p.Jitter = JitterNone },
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 5*time.Second)
			},
			errs: []error{errFlaky, errFlaky}, wantCalls: 1, wantErr: []error{ErrDeadline, errFlaky}, wantExh: 1},
		{name: "Retry-After beyond the deadline", policy: func(p *Policy) { p.Rand = zeroRand },
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 5*time.Second)
			},
			errs: []error{After(30*time.Second, errFlaky)}, wantCalls: 1, wantErr: []error{ErrDeadline}, wantExh: 1},
		{name: "MaxElapsed", policy: func(p *Policy) {
			p.Base, p.Cap, p.Jitter, p.MaxElapsed, p.MaxAttempts = time.Second, time.Minute, JitterNone, 2500*time.Millisecond, 10
		}, errs: []error{errFlaky, errFlaky, errFlaky}, wantCalls: 2, wantErr: []error{ErrMaxElapsed}, wantExh: 2,
			wantWaits: []time.Duration{time.Second}},
		{name: "no attempt limit", policy: func(p *Policy) { p.MaxAttempts = -1; p.Rand = zeroRand },
			errs: make10(errFlaky), wantCalls: 11},
		{name: "canceled before", ctx: func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, errs: []error{errFlaky}, wantCalls: 1, wantErr: []error{context.Canceled, errFlaky}, wantExh: 1},
		{name: "budget", policy: func(p *Policy) { p.Budget = NewBudget(4, 0.1); p.MaxAttempts = 10 },
			errs: make10(errFlaky), wantCalls: 2, wantErr: []error{ErrBudget}, wantExh: 2},
		// The deadlines are minutes away, so the context does not end during the test; the
		// fake clock's first wait brings the time to a few milliseconds before them.
		{name: "the next attempt would have less than MinAttempt", policy: func(p *Policy) { p.Base = 2 * time.Minute; p.Cap = time.Hour; p.Jitter = JitterNone },
			ctx:  deadlineAfterClock(2*time.Minute + DefaultMinAttempt - 5*time.Millisecond),
			errs: []error{errFlaky}, wantCalls: 1, wantErr: []error{ErrDeadline, errFlaky}, wantExh: 1},
		{name: "the next attempt would have MinAttempt", policy: func(p *Policy) { p.Base = 2 * time.Minute; p.Cap = time.Hour; p.Jitter = JitterNone },
			ctx:  deadlineAfterClock(2*time.Minute + DefaultMinAttempt),
			errs: []error{errFlaky}, wantCalls: 2},
		{name: "a negative MinAttempt lets any time left do", policy: func(p *Policy) {
			p.Base, p.Cap, p.Jitter, p.MinAttempt = 2*time.Minute, time.Hour, JitterNone, -1
		}, ctx: deadlineAfterClock(2*time.Minute + time.Millisecond), errs: []error{errFlaky}, wantCalls: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// In a bubble, so that the clock's now below and the now that sets the
			// context's deadline are the same instant, however long a busy machine keeps
			// the test from running between the two.
			synctest.Test(t, func(t *testing.T) {
				clock := newFakeClock()
				if tc.ctx != nil {
					clock.now = time.Now() // the deadlines below are counted from the clock's now
				}
				p := Policy{MaxAttempts: 3, Base: time.Millisecond, Clock: clock}
				if tc.policy != nil {
					tc.policy(&p)
				}
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if tc.ctx != nil {
					ctx, cancel = tc.ctx()
				}
				defer cancel()
				calls := 0
				err := Do(ctx, p, failing(&calls, tc.errs...))
				if calls != tc.wantCalls {
					t.Errorf("calls = %d, want %d", calls, tc.wantCalls)
				}
				if tc.wantErr == nil && err != nil {
					t.Fatalf("err = %v", err)
				}
				for _, target := range tc.wantErr {
					if !errors.Is(err, target) {
						t.Errorf("err = %v, does not match %v", err, target)
					}
				}
				var ex *ExhaustedError
				if isEx := errors.As(err, &ex); isEx != (tc.wantExh > 0) {
					t.Errorf("err = %v (%T), ExhaustedError wanted: %v", err, err, tc.wantExh > 0)
				} else if isEx {
					if ex.Attempts != tc.wantExh {
						t.Errorf("Attempts = %d, want %d", ex.Attempts, tc.wantExh)
					}
					if ex.Last != tc.errs[ex.Attempts-1] {
						t.Errorf("Last = %v, want the last attempt's error %v", ex.Last, tc.errs[ex.Attempts-1])
					}
				}
				waits := clock.Waits()
				if tc.wantWaits != nil && !equalDurations(waits, tc.wantWaits) {
					t.Errorf("waits = %v, want %v", waits, tc.wantWaits)
				}
				if tc.waitWithin[1] > 0 && (len(waits) != 1 || waits[0] < tc.waitWithin[0] || waits[0] > tc.waitWithin[1]) {
					t.Errorf("waits = %v, want one in [%v, %v]", waits, tc.waitWithin[0], tc.waitWithin[1])
				}
			})
		})
	}
}

// deadlineAfterClock returns a context whose deadline is d after now; the test sets its
// fake clock to the time, and runs in a synctest bubble, where the time stands still
// while the test runs: both read the same instant.
func deadlineAfterClock(d time.Duration) func() (context.Context, context.CancelFunc) {
	return func() (context.Context, context.CancelFunc) {
		return context.WithDeadline(context.Background(), time.Now().Add(d))
	}
}

func make10(err error) []error {
	errs := make([]error, 10)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// A cancellation during a wait ends the loop at once; Last is the attempt's error.
func TestDoCanceledWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	p := Policy{MaxAttempts: 3, Base: time.Hour, Jitter: JitterNone,
		OnRetry: func(Attempt) { time.AfterFunc(10*time.Millisecond, cancel) }}
	start := time.Now()
	err := Do(ctx, p, func(context.Context) error { return errFlaky })
	var ex *ExhaustedError
	if !errors.As(err, &ex) || ex.Attempts != 1 || ex.Last != errFlaky || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want an ExhaustedError{1, errFlaky, context.Canceled}", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
}

func TestDoOnRetry(t *testing.T) {
	t.Parallel()
	var got []Attempt
	p := Policy{MaxAttempts: 3, Base: time.Second, Jitter: JitterNone, Clock: newFakeClock(),
		OnRetry: func(a Attempt) { got = append(got, a) }}
	calls := 0
	_ = Do(context.Background(), p, failing(&calls, errFlaky, errFlaky))
	if len(got) != 2 || got[0].N != 1 || got[0].Wait != time.Second || got[1].N != 2 || got[1].Wait != 2*time.Second || got[0].Err != errFlaky {
		t.Errorf("OnRetry saw %+v", got)
	}
}

func TestDoValue(t *testing.T) {
	t.Parallel()
	p := Policy{MaxAttempts: 3, Clock: newFakeClock(), Rand: zeroRand}
	n := 0
	v, err := DoValue(context.Background(), p, func(context.Context) (int, error) {
		n++
		if n < 2 {
			return 7, errFlaky
		}
		return 42, nil
	})
	if v != 42 || err != nil {
		t.Errorf("DoValue = %d, %v", v, err)
	}
	v, err = DoValue(context.Background(), p, func(context.Context) (int, error) { return 7, Permanent(errFlaky) })
	if v != 0 || !errors.Is(err, errFlaky) {
		t.Errorf("DoValue = %d, %v; want the zero value and the error", v, err)
	}
}

func TestPermanentAndAfterNil(t *testing.T) {
	t.Parallel()
	if Permanent(nil) != nil || After(time.Second, nil) != nil {
		t.Error("Permanent(nil) and After(d, nil) must be nil")
	}
	err := After(-time.Second, errFlaky)
	var ra interface{ RetryAfter() (time.Duration, bool) }
	if !errors.As(err, &ra) {
		t.Fatal("After has no RetryAfter")
	}
	if d, ok := ra.RetryAfter(); d != 0 || !ok {
		t.Errorf("After(-1s) = %v, %v; want 0, true", d, ok)
	}
	if err.Error() != errFlaky.Error() || Permanent(errFlaky).Error() != errFlaky.Error() {
		t.Error("wrappers change the message")
	}
}

// An ExhaustedError reads as a sentence, on one line, whatever its errors say.
func TestExhaustedErrorMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  *ExhaustedError
		want string
	}{
		{&ExhaustedError{Attempts: 2, Last: errFlaky, Reason: ErrMaxAttempts}, "retry: attempts exhausted after 2 attempts: flaky"},
		{&ExhaustedError{Attempts: 1, Last: errFlaky, Reason: ErrBudget}, "retry: retry budget exhausted after 1 attempt: flaky"},
		{&ExhaustedError{Attempts: 1, Last: errors.Join(errFlaky, errors.New("second\r\nthird")), Reason: ErrMaxAttempts},
			"retry: attempts exhausted after 1 attempt: flaky; second; third"},
		{&ExhaustedError{Attempts: 3, Last: &StatusError{Class: ErrPlatform, Err: errors.New("a\nb")}, Reason: ErrDeadline},
			"retry: too little time left before the deadline after 3 attempts: retry: platform failure: a; b"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q\nwant      %q", got, tc.want)
		}
	}
	// Through Do, with an error of the caller's that spans lines.
	err := Do(context.Background(), Policy{MaxAttempts: 1}, func(context.Context) error { return errors.Join(errFlaky, errFlaky) })
	if want := "retry: attempts exhausted after 1 attempt: flaky; flaky"; err == nil || err.Error() != want {
		t.Errorf("Do: %q, want %q", err, want)
	}
}

// A Do loop over an HTTP call, with Classify: the 503's Retry-After is honoured.
func TestDoWithClassify(t *testing.T) {
	t.Parallel()
	srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "4")
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(204)
	})
	clock := newFakeClock()
	p := Policy{Clock: clock, Rand: zeroRand}
	err := Do(context.Background(), p, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return Classify(resp, err)
	})
	if err != nil || srv.Executions() != 2 {
		t.Fatalf("err = %v after %d executions", err, srv.Executions())
	}
	if w := clock.Waits(); len(w) != 1 || w[0] != 4*time.Second {
		t.Errorf("waits = %v, want [4s]", w)
	}
}
