// Package dueq calls a function for each item a fixed interval after the item was
// queued, unless it is removed first, with one timer for the whole queue.
//
// Items queued with one interval fall due in the order they were queued, so a list in
// that order and a timer armed for its head serve all of them. A timer of each item's
// own (time.AfterFunc) costs every item the timer's insertion into the runtime's timer
// heap and its removal, for a callback that most items never need: a request's lease
// renewal, or its timeout, is there for the rare request that runs long.
package dueq

import (
	"sync"
	"time"
)

// Queue is a queue of items that fall due Every after they were queued. Its zero
// value is not usable: call Init. A Queue must not be copied after its first use.
type Queue[T any] struct {
	every time.Duration
	fire  func(T)

	mu         sync.Mutex
	head, tail *Item[T]
	base       time.Time   // the clock's reading when the timer was made: dues are offsets from it
	t          *time.Timer // made at the first Push
	armed      bool        // t will fire, and look at the head then
}

// Item is one entry of a Queue, held in what it times (no allocation of its own). Its
// zero value is an item not queued. An Item is in one Queue at a time.
type Item[T any] struct {
	v          T
	due        time.Duration // from the queue's base
	prev, next *Item[T]
	queued     bool
}

// Init makes q call fire(v), in a goroutine of its own as time.AfterFunc does, for
// each item queued with v, every after it was queued. every must be positive.
func (q *Queue[T]) Init(every time.Duration, fire func(T)) {
	q.every, q.fire = every, fire
}

// Every returns the interval after which an item falls due.
func (q *Queue[T]) Every() time.Duration { return q.every }

// Push queues it, to fire with v Every from now. it must not be queued.
func (q *Queue[T]) Push(it *Item[T], v T) {
	q.mu.Lock()
	if q.t == nil {
		q.base = time.Now()
		q.t = time.AfterFunc(q.every, q.run)
		q.armed = true
	}
	// Read under the lock, so that the list's order is the order of the dues. Since
	// reads only the monotonic clock, at half the cost of time.Now.
	it.v, it.due, it.queued = v, time.Since(q.base)+q.every, true
	it.prev, it.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = it
	} else {
		q.head = it
	}
	q.tail = it
	if !q.armed {
		q.t.Reset(q.every)
		q.armed = true
	}
	q.mu.Unlock()
}

// Remove takes it out of q, and reports whether it was there: false when it was never
// queued, was removed already, or has fallen due (its call made or under way).
func (q *Queue[T]) Remove(it *Item[T]) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !it.queued {
		return false
	}
	q.unlink(it)
	return true
}

func (q *Queue[T]) unlink(it *Item[T]) {
	if it.prev != nil {
		it.prev.next = it.next
	} else {
		q.head = it.next
	}
	if it.next != nil {
		it.next.prev = it.prev
	} else {
		q.tail = it.prev
	}
	var zero T
	it.v, it.prev, it.next, it.queued = zero, nil, nil, false
}

// run is the timer's: it takes the items that have fallen due off the list, arms the
// timer for the next one, and calls fire for each.
func (q *Queue[T]) run() {
	var due []T
	q.mu.Lock()
	now := time.Since(q.base)
	for q.head != nil && q.head.due <= now {
		it := q.head
		due = append(due, it.v)
		q.unlink(it)
	}
	q.armed = q.head != nil
	if q.armed {
		q.t.Reset(q.head.due - now)
	}
	q.mu.Unlock()
	for _, v := range due {
		go q.fire(v)
	}
}
