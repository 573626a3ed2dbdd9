// Package lazyctx provides a context whose cancellation of its own is made only when
// something needs it.
//
// A layer that bounds a request's context — with a deadline, or with an end of its own
// when the request is over — pays, through package context, for a context linked into
// its parent's children, a timer for the deadline, a channel once Done is asked for,
// and the link's removal at the end: on every request. Most requests end long before
// their deadline, and often nothing below the layer ever waits on its Done (a call
// detached with context.WithoutCancel, a store that only polls Err). A Context
// answers from its parent and the clock until then, and makes the cancellation of
// package context (context.WithCancelCause, or context.WithDeadlineCause for a
// deadline) only when it is asked for Done, or once it has ended (End called, or its
// deadline reached): from then on that cancellation answers every method, so Err,
// Done and context.Cause always agree, for a goroutine left behind too.
package lazyctx

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Context is a context.Context over a parent, with an optional deadline of its own and
// an end (End). Its zero value is not usable: call Init first. Use it by pointer; it
// is meant to be embedded in a request's state, made in the same allocation.
type Context struct {
	parent   context.Context
	deadline time.Time   // its own, earlier than the parent's; zero: none of its own
	cause    error       // the deadline's cause
	made     atomic.Bool // own is set: stored under mu, after own
	ended    atomic.Bool // set under mu, with endCause

	mu       sync.Mutex
	endCause error
	own      own // valid once made
}

// own is a Context's cancellation, once made: a context.WithCancelCause (cancel), or a
// context.WithDeadlineCause (stop).
type own struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   context.CancelFunc
}

func (o *own) end(cause error) {
	if o.stop != nil {
		o.stop()
	} else {
		o.cancel(cause)
	}
}

// Init makes c a context of parent that ends at deadline with cause, as
// context.WithDeadlineCause(parent, deadline, cause) would. A zero deadline, or one no
// earlier than parent's, gives c no deadline of its own: it ends with its parent or
// End, as context.WithCancelCause(parent) would. Call Init once, before anything else.
func (c *Context) Init(parent context.Context, deadline time.Time, cause error) {
	c.parent = parent
	if deadline.IsZero() {
		return
	}
	if pd, ok := parent.Deadline(); ok && !deadline.Before(pd) {
		return
	}
	c.deadline, c.cause = deadline, cause
}

// Unmade returns c's parent and its deadline (zero: none of its own, the parent's
// applies), and true, while c's own cancellation has not been made and c has not
// ended; false once either has happened. A caller whose work ends before c's deadline
// and before c's end can then derive its context from the parent, with c's values,
// and c's cancellation is never made for it.
func (c *Context) Unmade() (parent context.Context, deadline time.Time, ok bool) {
	if c.made.Load() || c.ended.Load() {
		return nil, time.Time{}, false
	}
	return c.parent, c.deadline, true
}

// End ends c, with cause (nil: context.Canceled), as the CancelCauseFunc of
// context.WithCancelCause would; the first end wins. A Context with a deadline of its
// own ends with context.Canceled, whatever cause says, as the CancelFunc of
// context.WithDeadlineCause does.
func (c *Context) End(cause error) {
	c.mu.Lock()
	if c.ended.Load() {
		c.mu.Unlock()
		return
	}
	c.endCause = cause
	c.ended.Store(true)
	made := c.made.Load()
	c.mu.Unlock()
	if made {
		c.own.end(cause)
	}
}

// mine returns c's own cancellation's context, making it if need be.
func (c *Context) mine() context.Context {
	if c.made.Load() {
		return c.own.ctx
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.made.Load() {
		return c.own.ctx
	}
	o := &c.own
	if c.deadline.IsZero() {
		o.ctx, o.cancel = context.WithCancelCause(c.parent)
	} else {
		o.ctx, o.stop = context.WithDeadlineCause(c.parent, c.deadline, c.cause)
	}
	if c.ended.Load() {
		o.end(c.endCause)
	}
	c.made.Store(true)
	return o.ctx
}

// over reports whether c has ended or reached its deadline, and so must answer from
// its own cancellation.
func (c *Context) over() bool {
	// Until reads only the monotonic clock (the deadline carries a reading of it when
	// it was made from time.Now), at half the cost of time.Now: Err is asked often.
	return c.ended.Load() || !c.deadline.IsZero() && time.Until(c.deadline) <= 0
}

// Deadline returns c's deadline, or its parent's.
func (c *Context) Deadline() (time.Time, bool) {
	if !c.deadline.IsZero() {
		return c.deadline, true
	}
	return c.parent.Deadline()
}

// Done makes c's own cancellation, and returns its channel.
func (c *Context) Done() <-chan struct{} { return c.mine().Done() }

// Err returns the error of c's own cancellation once it is made or needed (c is over),
// and its parent's before: until then c ends only with its parent, and so reports what
// a context.WithCancelCause of the parent would.
func (c *Context) Err() error {
	if c.made.Load() {
		return c.own.ctx.Err()
	}
	if c.over() {
		return c.mine().Err()
	}
	return c.parent.Err()
}

// Value returns the value of key as c's own cancellation, once made, reports it, or
// as its parent does before. context.Cause asks Err first, which makes the
// cancellation of a c that is over, so its cause is c's own.
func (c *Context) Value(key any) any {
	if c.made.Load() {
		return c.own.ctx.Value(key)
	}
	if c.ended.Load() {
		return c.mine().Value(key)
	}
	return c.parent.Value(key)
}
