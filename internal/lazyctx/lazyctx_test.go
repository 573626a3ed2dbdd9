package lazyctx

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

var errBudget = errors.New("budget ran out")

// newCtx returns a Context of parent ending at deadline with errBudget.
func newCtx(parent context.Context, deadline time.Time) *Context {
	c := &Context{}
	c.Init(parent, deadline, errBudget)
	return c
}

// ended checks that c has ended with err and cause, through every method.
func ended(t *testing.T, c context.Context, err, cause error) {
	t.Helper()
	if got := c.Err(); !errors.Is(got, err) {
		t.Errorf("Err: %v, want %v", got, err)
	}
	if got := context.Cause(c); !errors.Is(got, cause) {
		t.Errorf("Cause: %v, want %v", got, cause)
	}
	select {
	case <-c.Done():
	default:
		t.Error("Done not closed")
	}
}

// A deadline reached with nothing asked of the context before, no timer running: the
// first method called after it, whichever, sees the deadline's end, and the others
// agree.
func TestDeadlineReachedUnasked(t *testing.T) {
	for _, first := range []string{"Err", "Cause", "Done", "Value"} {
		t.Run(first, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newCtx(context.Background(), time.Now().Add(time.Second))
				if err := c.Err(); err != nil {
					t.Fatalf("Err before the deadline: %v", err)
				}
				time.Sleep(time.Second)
				switch first {
				case "Err":
					if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("Err after the deadline: %v", err)
					}
				case "Cause":
					if err := context.Cause(c); !errors.Is(err, errBudget) {
						t.Errorf("Cause after the deadline: %v", err)
					}
				case "Done":
					<-c.Done() // closed at once: the deadline has passed
				case "Value":
					_ = c.Value("x")
				}
				ended(t, c, context.DeadlineExceeded, errBudget)
			})
		})
	}
}

// Asked for Done before its deadline, the context closes it at the deadline.
func TestDeadlineWithDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		c := newCtx(context.Background(), start.Add(time.Second))
		done := c.Done()
		select {
		case <-done:
			t.Fatal("Done closed before the deadline")
		default:
		}
		<-done
		if d := time.Since(start); d != time.Second {
			t.Errorf("Done closed after %v, want 1s", d)
		}
		ended(t, c, context.DeadlineExceeded, errBudget)
	})
}

// Until it is over or asked for Done, the context makes no cancellation of its own: it
// answers from its parent.
func TestNothingMadeUntilNeeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent := context.WithValue(context.Background(), "k", "v")
		c := newCtx(parent, time.Now().Add(time.Minute))
		if dl, ok := c.Deadline(); !ok || !dl.Equal(time.Now().Add(time.Minute)) {
			t.Errorf("Deadline: %v %v", dl, ok)
		}
		if err := c.Err(); err != nil {
			t.Errorf("Err: %v", err)
		}
		if v := c.Value("k"); v != "v" {
			t.Errorf("Value: %v", v)
		}
		if context.Cause(c) != nil {
			t.Errorf("Cause: %v", context.Cause(c))
		}
		_ = context.WithoutCancel(c)
		if c.made.Load() {
			t.Error("a cancellation was made though nothing needed it")
		}
		_ = c.Done()
		if !c.made.Load() {
			t.Error("Done made no cancellation")
		}
	})
}

// End, before or after the cancellation is made, ends the context with its cause (no
// deadline of its own) or with context.Canceled (a deadline of its own); the first end
// wins.
func TestEnd(t *testing.T) {
	errLost := errors.New("lost")
	for _, c := range []struct {
		name      string
		deadline  bool
		doneFirst bool
		cause     error
	}{
		{"no deadline", false, false, errLost},
		{"no deadline, Done first", false, true, errLost},
		{"deadline", true, false, context.Canceled},
		{"deadline, Done first", true, true, context.Canceled},
	} {
		t.Run(c.name, func(t *testing.T) {
			var dl time.Time
			if c.deadline {
				dl = time.Now().Add(time.Hour)
			}
			ctx := newCtx(context.Background(), dl)
			if c.doneFirst {
				_ = ctx.Done()
			}
			ctx.End(errLost)
			ctx.End(errors.New("second"))
			ended(t, ctx, context.Canceled, c.cause)
		})
	}
}

// A parent's end reaches the context, with the parent's cause, whether or not the
// context made a cancellation of its own.
func TestParentEnds(t *testing.T) {
	errGone := errors.New("client gone")
	for _, doneFirst := range []bool{false, true} {
		parent, cancel := context.WithCancelCause(context.Background())
		c := newCtx(parent, time.Now().Add(time.Hour))
		if doneFirst {
			_ = c.Done()
		}
		cancel(errGone)
		ended(t, c, context.Canceled, errGone)
	}
}

// A deadline no earlier than the parent's is not the context's own: the parent's
// deadline ends it, with the parent's cause.
func TestParentDeadlineFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errParent := errors.New("parent's budget")
		parent, cancel := context.WithDeadlineCause(context.Background(), time.Now().Add(time.Second), errParent)
		defer cancel()
		c := newCtx(parent, time.Now().Add(time.Minute))
		if dl, _ := c.Deadline(); !dl.Equal(time.Now().Add(time.Second)) {
			t.Errorf("Deadline %v, want the parent's", dl)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		ended(t, c, context.DeadlineExceeded, errParent)
	})
}

// Done, Err, Value and End from many goroutines at once make one cancellation, and all
// see the end (run with -race).
func TestConcurrent(t *testing.T) {
	c := newCtx(context.Background(), time.Now().Add(time.Hour))
	var wg sync.WaitGroup
	dones := make([]<-chan struct{}, 8)
	for i := range dones {
		wg.Go(func() {
			_ = c.Err()
			_ = c.Value("x")
			dones[i] = c.Done()
		})
	}
	wg.Go(func() { c.End(nil) })
	wg.Wait()
	for i, d := range dones {
		if d != dones[0] {
			t.Errorf("goroutine %d got another Done channel", i)
		}
		<-d
	}
}

// TestUnmade: the parent and the deadline are handed out only while neither the
// context's cancellation has been made nor it has ended.
func TestUnmade(t *testing.T) {
	parent := context.Background()
	dl := time.Now().Add(time.Hour)
	for _, c := range []struct {
		name string
		do   func(*Context)
		ok   bool
	}{
		{"untouched", func(*Context) {}, true},
		{"asked for Err and Value", func(c *Context) { _, _ = c.Err(), c.Value("k") }, true},
		{"asked for Done", func(c *Context) { _ = c.Done() }, false},
		{"ended", func(c *Context) { c.End(nil) }, false},
	} {
		ctx := newCtx(parent, dl)
		c.do(ctx)
		p, d, ok := ctx.Unmade()
		if ok != c.ok || ok && (p != parent || !d.Equal(dl)) {
			t.Errorf("%s: Unmade %v %v %v, want %v", c.name, p, d, ok, c.ok)
		}
	}
}
