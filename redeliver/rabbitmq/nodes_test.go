package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/retry"
)

// fakeNodes are TCP listeners that each accept connections and close them at once (so
// an AMQP dial to them fails), recording which one was dialled, in order.
type fakeNodes struct {
	urls  []string
	dials chan int
}

func newFakeNodes(t *testing.T, n int) *fakeNodes {
	t.Helper()
	f := &fakeNodes{dials: make(chan int, 1000)}
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				f.dials <- i
				_ = c.Close()
			}
		}()
		f.urls = append(f.urls, fmt.Sprintf("amqp://guest:secret@%s/", ln.Addr()))
	}
	return f
}

// next returns the nodes dialled, in order, until want of them.
func (f *fakeNodes) next(t *testing.T, want int) []int {
	t.Helper()
	var got []int
	for len(got) < want {
		select {
		case i := <-f.dials:
			got = append(got, i)
		case <-time.After(10 * time.Second):
			t.Fatalf("dials %v, want %d of them", got, want)
		}
	}
	return got
}

// TestNodesConfig: URL alone, URLs alone and both are accepted, in that order; an empty
// or unparsable URL, a repeated node and no URL at all are ErrConfig, and the errors
// never show a password.
func TestNodesConfig(t *testing.T) {
	a, b := "amqp://u:secret@h1:5672/", "amqp://u:secret@h2:5673/"
	for _, c := range []struct {
		url  string
		urls []string
		want []string
	}{
		{a, nil, []string{a}},
		{"", []string{a, b}, []string{a, b}},
		{a, []string{b}, []string{a, b}},
		{"amqp://u:secret@h1/", []string{"amqp://u:secret@h1:5672/other"}, []string{"amqp://u:secret@h1/", "amqp://u:secret@h1:5672/other"}},
	} {
		got, err := newNodes("Config", c.url, c.urls)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("newNodes(%q, %q) = %v, %v; want %v", c.url, c.urls, got, err, c.want)
		}
	}
	for _, c := range []struct {
		url  string
		urls []string
	}{
		{"", nil},
		{a, []string{""}},
		{a, []string{"http://u:secret@h2/"}},
		{"not a url", nil},
		{a, []string{a}},
		{a, []string{"amqp://v:other@h1/"}}, // the same node (port 5672 by default), other credentials
		{"", []string{b, b}},
	} {
		_, err := newNodes("Config", c.url, c.urls)
		if !errors.Is(err, ErrConfig) {
			t.Errorf("newNodes(%q, %q): %v, want ErrConfig", c.url, c.urls, err)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("newNodes(%q, %q): %v shows the password", c.url, c.urls, err)
		}
	}
	ctx := t.Context()
	if _, err := NewSource(ctx, Config{Queue: "q", URL: a, URLs: []string{a}}); !errors.Is(err, ErrConfig) {
		t.Errorf("NewSource with a repeated node: %v, want ErrConfig", err)
	}
	if _, err := NewPublisher(ctx, PublisherConfig{URLs: []string{""}}); !errors.Is(err, ErrConfig) {
		t.Errorf("NewPublisher with an empty URL: %v, want ErrConfig", err)
	}
	if got := hostOf(a); got != "h1:5672" {
		t.Errorf("hostOf(%q) = %q, want h1:5672", a, got)
	}
}

// TestNodesRotation checks the order in which the Source and the Publisher try the
// nodes, against listeners that refuse the AMQP handshake: a first connection tries URL
// then URLs in order, and fails (naming every node, no password) when none answers; a
// reconnect starts with the node after the one it lost (or tried last), goes round,
// and keeps going round after the backoff.
func TestNodesRotation(t *testing.T) {
	f := newFakeNodes(t, 3)
	ctx := t.Context()
	cfg := Config{URL: f.urls[0], URLs: f.urls[1:], Queue: "q", Logger: quiet(),
		Reconnect: retry.Policy{Base: time.Millisecond, Cap: 5 * time.Millisecond}}
	_, err := NewSource(ctx, cfg)
	if err == nil {
		t.Fatal("NewSource succeeded with no broker")
	}
	if got := f.next(t, 3); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("NewSource tried nodes %v, want [0 1 2]", got)
	}
	for _, u := range f.urls {
		if !strings.Contains(err.Error(), hostOf(u)) {
			t.Errorf("NewSource's error %q does not name node %s", err, hostOf(u))
		}
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("NewSource's error %q shows the password", err)
	}

	// A Source that lost node 1 reconnects to 2, 0, 1, 2, 0 …
	ns, err := newNodes("Config", cfg.URL, cfg.URLs)
	if err != nil {
		t.Fatal(err)
	}
	src := &Source{cfg: cfg, nodes: ns, log: quiet()}
	src.node.Store(1)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := src.reconnect(rctx, nil); done <- err }()
	got := f.next(t, 7)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("reconnect ended with %v, want context.Canceled", err)
	}
	if want := []int{2, 0, 1, 2, 0, 1, 2}; !slices.Equal(got, want) {
		t.Errorf("a Source that lost node 1 tried nodes %v, want %v", got, want)
	}

	// The Publisher (on other listeners: a dial of the cancelled reconnect may still
	// arrive): each node once per Publish, URL first, then from the one after the node
	// tried last.
	f = newFakeNodes(t, 3)
	p, err := NewPublisher(ctx, PublisherConfig{URL: f.urls[0], URLs: f.urls[1:]})
	if err == nil {
		_ = p.Close()
		t.Fatal("NewPublisher succeeded with no broker")
	}
	if got := f.next(t, 3); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("NewPublisher tried nodes %v, want [0 1 2]", got)
	}
	if ns, err = newNodes("PublisherConfig", f.urls[0], f.urls[1:]); err != nil {
		t.Fatal(err)
	}
	p = &Publisher{nodes: ns, node: 1, dialed: true}
	for range 2 {
		if _, err := p.channel(ctx); err == nil {
			t.Fatal("Publisher.channel succeeded with no broker")
		}
	}
	if got := f.next(t, 6); !slices.Equal(got, []int{2, 0, 1, 2, 0, 1}) {
		t.Errorf("a Publisher that lost node 1 tried nodes %v on two publishes, want [2 0 1 2 0 1]", got)
	}
}
