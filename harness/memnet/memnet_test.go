package memnet_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/harness/memnet"
)

// An HTTP round trip over the Listener, in a bubble: the handler's one virtual minute
// passes without the test waiting for it.
func TestHTTPOverListenerRunsOnTheBubblesClock(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := memnet.New()
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(time.Minute) // virtual
			io.WriteString(w, "late")
		})}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
		tr := &http.Transport{DialContext: l.DialContext}
		defer tr.CloseIdleConnections()
		start := time.Now()
		resp, err := (&http.Client{Transport: tr}).Get("http://any/")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(body) != "late" {
			t.Fatalf("body %q, err %v", body, err)
		}
		if took := time.Since(start); took != time.Minute {
			t.Errorf("the answer came after %v of the bubble's time, want exactly 1m", took)
		}
	})
}

// A closed Listener accepts nothing and dials nothing; a dial whose context ends while
// no one accepts fails with the context's error.
func TestClosedListenerAndCanceledDial(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := memnet.New()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if _, err := l.DialContext(ctx, "tcp", "x"); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("dial with no Accept: %v, want context.DeadlineExceeded", err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
		}
		if _, err := l.DialContext(t.Context(), "tcp", "x"); !errors.Is(err, net.ErrClosed) {
			t.Errorf("dial after Close: %v, want net.ErrClosed", err)
		}
		if a := l.Addr(); a.Network() != "mem" || a.String() != "mem" {
			t.Errorf("Addr = %s %s", a.Network(), a.String())
		}
	})
}
